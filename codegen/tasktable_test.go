package codegen

import (
	"testing"

	"github.com/kinst/kinst/metrics"
)

const (
	tTable   = 0xffffffffc0500100
	tOff     = 0xffffffffc0500010
	tDropped = 0xffffffffc0500018
	tTaskB   = 0xffff888100010000
	tTaskC   = 0xffff888100020000
)

// virtualPatches loads the entry, exit and switch patches of one region
// and returns their [start, end) ranges.
func virtualPatches(t *testing.T, m *machine, entries int) (enter, exit, sw [2]uint64) {
	table := TaskTable{Addr: tTable, Entries: entries}
	enter[0], exit[0], sw[0] = tPatch, tPatch+0x1000, tPatch+0x2000
	enter[1] = load(t, m, enter[0], AllLive, Seq{Counter{Addr: tCalls},
		TaskEnter{Table: table, CurrentTask: tCurrent, Dropped: tDropped, Then: []Snippet{TimerEnter{Word: tTimer}}}})
	exit[1] = load(t, m, exit[0], AllLive, TaskExit{Table: table, CurrentTask: tCurrent, Then: []Snippet{TimerExit{Word: tTimer}}})
	sw[1] = load(t, m, sw[0], AllLive, SwitchOffCPU{Regions: []OffCPU{{Table: table, Word: tOff}}})
	return
}

func runRange(t *testing.T, c *cpu, r [2]uint64) {
	t.Helper()
	regs, fl := c.r, c.flags
	if err := c.run(r[0], r[1]); err != nil {
		t.Fatal(err)
	}
	if c.r != regs || c.flags != fl {
		t.Fatalf("registers or flags changed by the patch at %#x", r[0])
	}
}

// TestVirtualTimer: task A enters the region twice (recursion), is
// switched out and back in, and leaves twice. Wall time runs from its
// outermost entry to its outermost exit; off-CPU time from the switch out
// to the switch in; virtual time is their difference.
func TestVirtualTimer(t *testing.T) {
	m := newMachine()
	enter, exit, sw := virtualPatches(t, m, 4)
	c := newCPU(m, 0xffffc90000010000, tTask)
	switchTo := func(prev, next uint64) {
		c.r[7], c.r[6] = prev, next // %rdi, %rsi as __switch_to has them
		runRange(t, c, sw)
		m.write(c.gsBase+tCurrent, 8, next)
	}
	runRange(t, c, enter)
	entered := c.tscs[len(c.tscs)-1]
	runRange(t, c, enter) // recursion: no second timer entry
	if n := len(c.tscs); n != 1 {
		t.Fatalf("%d TSC reads after two entries, want 1 (outermost only)", n)
	}
	switchTo(tTask, tTaskB) // A out: A is inside
	out := c.tscs[len(c.tscs)-1]
	runRange(t, c, exit)    // B leaves without having entered: ignored
	switchTo(tTaskB, tTask) // A back in
	in := c.tscs[len(c.tscs)-1]
	runRange(t, c, exit)
	runRange(t, c, exit)
	left := c.tscs[len(c.tscs)-1]
	if len(c.tscs) != 4 {
		t.Fatalf("%d TSC reads, want 4 (enter, switch out, switch in, exit)", len(c.tscs))
	}
	w, off := m.read(tTimer, 8), m.read(tOff, 8)
	now := m.tsc + 1000
	if metrics.TimerInside(w) != 0 || metrics.TimerIntegral(w, now) != left-entered {
		t.Errorf("wall: inside %d, integral %d, want 0 and %d", metrics.TimerInside(w), metrics.TimerIntegral(w, now), left-entered)
	}
	if metrics.TimerInside(off) != 0 || metrics.TimerIntegral(off, now) != in-out {
		t.Errorf("off-CPU: inside %d, integral %d, want 0 and %d", metrics.TimerInside(off), metrics.TimerIntegral(off, now), in-out)
	}
	if calls := m.read(tCalls, 8); calls != 2 {
		t.Errorf("calls %d, want 2", calls)
	}
	for i := 0; i < 4; i++ {
		if k := m.read(tTable+uint64(16*i), 8); k != 0 {
			t.Errorf("entry %d still holds %#x after the outermost exit", i, k)
		}
	}
}

// TestTaskTableFull: with a 2-entry table the third task inside is
// counted as dropped and not timed; the others are.
func TestTaskTableFull(t *testing.T) {
	m := newMachine()
	enter, exit, _ := virtualPatches(t, m, 2)
	var cpus []*cpu
	for i, task := range []uint64{tTask, tTaskB, tTaskC} {
		c := newCPU(m, 0xffffc90000010000+uint64(i)*0x4000, task)
		runRange(t, c, enter)
		cpus = append(cpus, c)
	}
	if d := m.read(tDropped, 8); d != 1 {
		t.Fatalf("dropped %d, want 1", d)
	}
	if in := metrics.TimerInside(m.read(tTimer, 8)); in != 2 {
		t.Fatalf("%d inside, want 2", in)
	}
	for _, c := range cpus {
		runRange(t, c, exit)
	}
	if w := m.read(tTimer, 8); metrics.TimerInside(w) != 0 {
		t.Fatalf("%d inside after every exit", metrics.TimerInside(w))
	}
	// A freed entry is claimed again, with its depth reset.
	runRange(t, cpus[2], enter)
	if in := metrics.TimerInside(m.read(tTimer, 8)); in != 1 {
		t.Fatalf("%d inside after a new entry, want 1", in)
	}
}

// RegEquals guards a table entry on the first argument: only the lock
// asked for is timed, and exits of waiters for other locks are ignored
// because they never entered the table.
func TestRegEqualsGuard(t *testing.T) {
	const lock = 0xffff888012345678
	m := newMachine()
	table := TaskTable{Addr: tTable, Entries: 4}
	enter := [2]uint64{tPatch, 0}
	enter[1] = load(t, m, enter[0], AllLive, Guard{If: RegEquals{Reg: RDI, Value: lock}, Then: []Snippet{Seq{Counter{Addr: tCalls},
		TaskEnter{Table: table, CurrentTask: tCurrent, Dropped: tDropped, Then: []Snippet{TimerEnter{Word: tTimer}}}}}})
	exit := [2]uint64{tPatch + 0x1000, 0}
	exit[1] = load(t, m, exit[0], AllLive, TaskExit{Table: table, CurrentTask: tCurrent, Then: []Snippet{TimerExit{Word: tTimer}}})
	a := newCPU(m, 0xffffc90000010000, tTask)
	b := newCPU(m, 0xffffc90000014000, tTaskB)
	a.r[7], b.r[7] = lock, lock+0x40
	runRange(t, a, enter)
	runRange(t, b, enter)
	if calls, in := m.read(tCalls, 8), metrics.TimerInside(m.read(tTimer, 8)); calls != 1 || in != 1 {
		t.Fatalf("calls %d inside %d; want only the waiter for the lock", calls, in)
	}
	runRange(t, b, exit)
	if in := metrics.TimerInside(m.read(tTimer, 8)); in != 1 {
		t.Fatal("the other lock's waiter ended the timed interval")
	}
	runRange(t, a, exit)
	if in := metrics.TimerInside(m.read(tTimer, 8)); in != 0 {
		t.Fatal("the waiter's exit was not counted")
	}
}
