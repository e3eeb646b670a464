package codegen

import (
	"errors"
	"fmt"
	"math/rand"
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
	"github.com/kinst/kinst/metrics"
)

const (
	tPatch   = 0xffffffffc0400000
	tCalls   = 0xffffffffc0500000
	tTimer   = 0xffffffffc0500008
	tGS      = 0xffff888000100000
	tCurrent = 0x1fb80
	tTask    = 0xffff888100000000
	tPIDOff  = 0x5c8
	tTGIDOff = 0x5cc
	tCommOff = 0x7c0
)

// newCPU is a CPU of m with its own stack and current task.
func newCPU(m *machine, stack, task uint64) *cpu {
	c := &cpu{m: m, gsBase: tGS + stack} // a per-CPU area of its own
	c.r[4] = stack
	for i := range c.r {
		if i != 4 {
			c.r[i] = 0x1111111111111111 * uint64(i+1)
		}
	}
	c.flags = 0x246
	m.write(c.gsBase+tCurrent, 8, task)
	return c
}

func setTask(m *machine, task uint64, pid, tgid uint32, comm string) {
	m.write(task+tPIDOff, 4, uint64(pid))
	m.write(task+tTGIDOff, 4, uint64(tgid))
	var b [TaskCommLen]byte
	copy(b[:], comm)
	m.load(task+tCommOff, b[:])
}

// site is an instruction the patches relocate (mov $0x31c40,%r12).
var tSite = Site{Addr: 0xffffffffae4dcf74, Bytes: []byte{0x49, 0xc7, 0xc4, 0x40, 0x1c, 0x03, 0x00}}

// load builds a patch of snippets at base, verifies it and loads its
// instrumentation into m; it returns the end of the instrumentation.
func load(t *testing.T, m *machine, base uint64, live Live, snippets ...Snippet) uint64 {
	t.Helper()
	spec := PatchSpec{Site: tSite, Live: live, Snippets: snippets}
	p, err := BuildPatch(base, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyPatch(p, spec); err != nil {
		t.Fatalf("VerifyPatch: %v", err)
	}
	m.load(base, p.Code[:p.Instr])
	return base + uint64(p.Instr)
}

// runPreserving runs the instrumentation at tPatch on c and checks that
// the registers, the stack pointer and RFLAGS are as before: every register
// and flag is live in these patches.
func runPreserving(t *testing.T, c *cpu, end uint64) {
	t.Helper()
	r, fl := c.r, c.flags
	if err := c.run(tPatch, end); err != nil {
		t.Fatal(err)
	}
	if c.r != r {
		t.Fatalf("registers changed:\n%x\n%x", r, c.r)
	}
	if c.flags != fl {
		t.Fatalf("flags %#x, want %#x", c.flags, fl)
	}
}

func TestGuardedCounterOnTask(t *testing.T) {
	var comm [TaskCommLen]byte
	copy(comm[:], "openbench-worke") // the kernel keeps 15 bytes and a NUL
	tgid := func(v int32) Predicate { return TaskField32{CurrentTask: tCurrent, Offset: tTGIDOff, Value: v} }
	byComm := TaskComm{CurrentTask: tCurrent, Offset: tCommOff, Comm: comm}
	tests := []struct {
		name      string
		pred      Predicate
		pid, tgid uint32
		comm      string
		want      uint64
	}{
		{"no guard", nil, 5, 5, "x", 1},
		{"tgid match", tgid(42), 43, 42, "x", 1},
		{"tgid other", tgid(42), 42, 41, "x", 0},
		{"pid match", TaskField32{CurrentTask: tCurrent, Offset: tPIDOff, Value: 7}, 7, 1, "x", 1},
		{"comm match", byComm, 1, 1, "openbench-worke", 1},
		{"comm differs late", byComm, 1, 1, "openbench-worka", 0},
		{"comm differs early", byComm, 1, 1, "xpenbench-worke", 0},
		{"comm prefix only", byComm, 1, 1, "openbench", 0},
	}
	for _, tc := range tests {
		for _, live := range []Live{AllLive, {}} {
			m := newMachine()
			setTask(m, tTask, tc.pid, tc.tgid, tc.comm)
			var sn Snippet = Counter{Addr: tCalls}
			if tc.pred != nil {
				sn = Guard{If: tc.pred, Then: []Snippet{sn}}
			}
			end := load(t, m, tPatch, live, sn)
			c := newCPU(m, 0xffffc90000010000, tTask)
			for i := 0; i < 3; i++ {
				if live == AllLive {
					runPreserving(t, c, end)
				} else if err := c.run(tPatch, end); err != nil {
					t.Fatal(err)
				}
			}
			if got := m.read(tCalls, 8); got != 3*tc.want {
				t.Errorf("%s (live %+v): count %d, want %d", tc.name, live, got, 3*tc.want)
			}
		}
	}
}

// TestTimerExact runs timer enter and exit patches on several CPUs
// interleaved one instruction at a time in random orders and compares the
// timer word's integral with the thread-time computed from the TSC values
// each CPU actually read.
func TestTimerExact(t *testing.T) {
	const ncpu = 4
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 200; round++ {
		m := newMachine()
		enterEnd := load(t, m, tPatch, AllLive, Counter{Addr: tCalls}, TimerEnter{Word: tTimer})
		exitBase := uint64(tPatch + 0x1000)
		exitEnd := load(t, m, exitBase, Live{Regs: 0xffff}, TimerExit{Word: tTimer})
		cpus := make([]*cpu, ncpu)
		for i := range cpus {
			cpus[i] = newCPU(m, 0xffffc90000010000+uint64(i)*0x4000, tTask)
		}
		// runAll runs [base, end) on every CPU, interleaved at random.
		runAll := func(base, end uint64) {
			t.Helper()
			for _, c := range cpus {
				c.pc = base
			}
			for {
				var live []*cpu
				for _, c := range cpus {
					if c.pc != end {
						live = append(live, c)
					}
				}
				if len(live) == 0 {
					return
				}
				if err := live[rng.Intn(len(live))].step(); err != nil {
					t.Fatal(err)
				}
			}
		}
		runAll(tPatch, enterEnd)
		w := m.read(tTimer, 8)
		if got := metrics.TimerInside(w); got != ncpu {
			t.Fatalf("round %d: %d inside after %d entries", round, got, ncpu)
		}
		now := m.tsc + 100
		var want uint64
		for _, c := range cpus {
			want += now - c.tscs[0]
		}
		if got := metrics.TimerIntegral(w, now); got != want {
			t.Fatalf("round %d: integral with all inside %d, want %d", round, got, want)
		}
		runAll(exitBase, exitEnd)
		w = m.read(tTimer, 8)
		want = 0
		for _, c := range cpus {
			want += c.tscs[1] - c.tscs[0]
		}
		if metrics.TimerInside(w) != 0 || metrics.TimerIntegral(w, m.tsc+12345) != want {
			t.Fatalf("round %d: after exits inside %d integral %d, want 0 and %d",
				round, metrics.TimerInside(w), metrics.TimerIntegral(w, m.tsc), want)
		}
		if calls := m.read(tCalls, 8); calls != ncpu {
			t.Fatalf("round %d: %d calls", round, calls)
		}
	}
}

// TestTimerUnmatchedExit: an exit with nobody inside (a thread that
// entered before the timer existed) changes nothing.
func TestTimerUnmatchedExit(t *testing.T) {
	m := newMachine()
	end := load(t, m, tPatch, AllLive, TimerExit{Word: tTimer})
	runPreserving(t, newCPU(m, 0xffffc90000010000, tTask), end)
	if w := m.read(tTimer, 8); w != 0 {
		t.Fatalf("unmatched exit left %#x", w)
	}
}

// TestTimerCheckRefuses corrupts timer snippets and expects their Check
// (run by VerifyPatch) to refuse them.
func TestTimerCheckRefuses(t *testing.T) {
	below := uint64(tPatch - 0x10000) // a negative displacement
	for _, sn := range []Snippet{TimerEnter{Word: tTimer}, TimerExit{Word: tTimer}, TimerEnter{Word: below}, TimerExit{Word: below}} {
		a := NewAsm(tPatch)
		sn.Emit(a, nil)
		good := a.Bytes()
		c := sn.(Checker)
		if err := c.Check(good, tPatch); err != nil {
			t.Fatalf("%v: good code refused: %v", sn, err)
		}
		// Every single-byte change that still decodes must be refused or
		// leave the same instructions (no such byte exists here).
		for i := range good {
			for _, x := range []byte{0x01, 0x80} {
				bad := append([]byte{}, good...)
				bad[i] ^= x
				if sameListing(good, bad) {
					continue // an equivalent encoding (REX.B is ignored with a RIP base)
				}
				if err := c.Check(bad, tPatch); !errors.Is(err, ErrVerify) {
					t.Errorf("%v: byte %d ^%#x accepted (%v)", sn, i, x, err)
				}
			}
		}
	}
}

// sameListing reports whether a and b decode to the same instructions.
func sameListing(a, b []byte) bool {
	la, lb := decodedListing(a), decodedListing(b)
	if len(la) != len(lb) {
		return false
	}
	for i := range la {
		if la[i] != lb[i] {
			return false
		}
	}
	return true
}

func decodedListing(code []byte) []string {
	var out []string
	for off := 0; off < len(code); {
		inst, err := x86dec.Decode(code[off:])
		if err != nil {
			return append(out, "bad")
		}
		out = append(out, fmt.Sprintf("%d %s", inst.Len, x86asm.GNUSyntax(inst, tPatch+uint64(off), nil)))
		off += inst.Len
	}
	return out
}
