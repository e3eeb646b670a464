package codegen

import (
	"errors"
	"math/rand"
	"testing"

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

// load generates p at tPatch into m and returns the end address.
func load(t *testing.T, m *machine, p *Probe) uint64 {
	t.Helper()
	code, err := p.Append(nil, tPatch)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyProbe(code, tPatch, len(code), p); err != nil {
		t.Fatalf("VerifyProbe: %v", err)
	}
	m.load(tPatch, code)
	return tPatch + uint64(len(code))
}

// runPreserving runs the probe and checks that registers, the stack
// pointer and (with SaveFlags) RFLAGS are as before.
func runPreserving(t *testing.T, c *cpu, end uint64, saveFlags bool) {
	t.Helper()
	r, fl := c.r, c.flags
	if err := c.run(tPatch, end); err != nil {
		t.Fatal(err)
	}
	if c.r != r {
		t.Fatalf("registers changed:\n%x\n%x", r, c.r)
	}
	if saveFlags && c.flags != fl {
		t.Fatalf("flags %#x, want %#x", c.flags, fl)
	}
}

func TestProbeCountGuards(t *testing.T) {
	var comm [TaskCommLen]byte
	copy(comm[:], "openbench-worker")
	tests := []struct {
		name  string
		guard *Guard
		pid   uint32
		tgid  uint32
		comm  string
		want  uint64
	}{
		{"no guard", nil, 5, 5, "x", 1},
		{"tgid match", &Guard{CurrentTask: tCurrent, Field: GuardTGID, Offset: tTGIDOff, Value: 42}, 43, 42, "x", 1},
		{"tgid other", &Guard{CurrentTask: tCurrent, Field: GuardTGID, Offset: tTGIDOff, Value: 42}, 42, 41, "x", 0},
		{"pid match", &Guard{CurrentTask: tCurrent, Field: GuardPID, Offset: tPIDOff, Value: 7}, 7, 1, "x", 1},
		{"comm match", &Guard{CurrentTask: tCurrent, Field: GuardComm, Offset: tCommOff, Comm: comm}, 1, 1, "openbench-worke", 1},
		{"comm differs late", &Guard{CurrentTask: tCurrent, Field: GuardComm, Offset: tCommOff, Comm: comm}, 1, 1, "openbench-worka", 0},
		{"comm differs early", &Guard{CurrentTask: tCurrent, Field: GuardComm, Offset: tCommOff, Comm: comm}, 1, 1, "xpenbench-worke", 0},
		{"comm prefix only", &Guard{CurrentTask: tCurrent, Field: GuardComm, Offset: tCommOff, Comm: comm}, 1, 1, "openbench", 0},
	}
	// The kernel pads comm with NULs (strscpy_pad); so does the guard.
	tests[4].guard.Comm = [TaskCommLen]byte{}
	copy(tests[4].guard.Comm[:], "openbench-worke")
	tests[5].guard.Comm = tests[4].guard.Comm
	tests[6].guard.Comm = tests[4].guard.Comm
	tests[7].guard.Comm = tests[4].guard.Comm
	for _, tc := range tests {
		for _, saveFlags := range []bool{false, true} {
			m := newMachine()
			setTask(m, tTask, tc.pid, tc.tgid, tc.comm)
			p := &Probe{Guard: tc.guard, Actions: []Action{{ActCount, tCalls}}, SaveFlags: saveFlags}
			end := load(t, m, p)
			c := newCPU(m, 0xffffc90000010000, tTask)
			for i := 0; i < 3; i++ {
				runPreserving(t, c, end, saveFlags)
			}
			if got := m.read(tCalls, 8); got != 3*tc.want {
				t.Errorf("%s (flags saved %v): count %d, want %d", tc.name, saveFlags, got, 3*tc.want)
			}
		}
	}
}

// TestProbeTimerExact runs enter and exit probes on several CPUs
// interleaved one instruction at a time in random orders and compares the
// timer word's integral with the thread-time computed from the TSC values
// each CPU actually read.
func TestProbeTimerExact(t *testing.T) {
	const ncpu = 4
	rng := rand.New(rand.NewSource(1))
	for round := 0; round < 200; round++ {
		m := newMachine()
		enter := &Probe{Actions: []Action{{ActCount, tCalls}, {ActEnter, tTimer}}}
		exit := &Probe{Actions: []Action{{ActExit, tTimer}}, SaveFlags: true}
		enterCode, _ := enter.Append(nil, tPatch)
		exitCode, _ := exit.Append(nil, tPatch+0x1000)
		m.load(tPatch, enterCode)
		m.load(tPatch+0x1000, exitCode)
		cpus := make([]*cpu, ncpu)
		for i := range cpus {
			cpus[i] = newCPU(m, 0xffffc90000010000+uint64(i)*0x4000, tTask)
		}
		// runAll runs code on every CPU, interleaved at random.
		runAll := func(base uint64, n int) {
			t.Helper()
			end := base + uint64(n)
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
		runAll(tPatch, len(enterCode))
		w := m.read(tTimer, 8)
		if got := metrics.TimerInside(w); got != ncpu {
			t.Fatalf("round %d: %d inside after %d entries", round, got, ncpu)
		}
		now := m.tsc + 100
		var want uint64
		for _, c := range cpus {
			want += now - c.tscs[0]
		}
		if got := metrics.TimerIntegral(w, now) - metrics.TimerIntegral(0, 0); got != want {
			t.Fatalf("round %d: integral with all inside %d, want %d", round, got, want)
		}
		runAll(tPatch+0x1000, len(exitCode))
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

// TestProbeUnmatchedExit: an exit with nobody inside (a thread that entered
// before the probe existed) changes nothing.
func TestProbeUnmatchedExit(t *testing.T) {
	m := newMachine()
	p := &Probe{Actions: []Action{{ActExit, tTimer}}}
	end := load(t, m, p)
	c := newCPU(m, 0xffffc90000010000, tTask)
	runPreserving(t, c, end, false)
	if w := m.read(tTimer, 8); w != 0 {
		t.Fatalf("unmatched exit left %#x", w)
	}
}

func TestVerifyProbeRefuses(t *testing.T) {
	p := &Probe{Guard: &Guard{CurrentTask: tCurrent, Field: GuardTGID, Offset: tTGIDOff, Value: 1},
		Actions: []Action{{ActCount, tCalls}, {ActEnter, tTimer}}, SaveFlags: true}
	code, err := p.Append(nil, tPatch)
	if err != nil {
		t.Fatal(err)
	}
	other := *p
	other.Actions = []Action{{ActCount, tCalls + 16}, {ActEnter, tTimer}}
	noFlags := *p
	noFlags.SaveFlags = true
	tests := []struct {
		name string
		code []byte
		p    *Probe
	}{
		{"other word", code, &other},
		{"dropped pop", append(append([]byte{}, code[:len(code)-2]...), code[len(code)-1]), p},
		{"no lock", func() []byte {
			c := append([]byte{}, code...)
			for i := range c {
				if c[i] == 0xf0 {
					c[i] = 0x90 // nop instead of lock: decodes as nop, then the add
					break
				}
			}
			return c
		}(), p},
		{"flags not saved", code[1 : len(code)-1], &noFlags},
	}
	for _, tc := range tests {
		if err := VerifyProbe(tc.code, tPatch, len(tc.code), tc.p); !errors.Is(err, ErrVerify) {
			t.Errorf("%s: VerifyProbe = %v, want a VerifyError", tc.name, err)
		}
	}
	if err := VerifyProbe(code, tPatch, len(code), p); err != nil {
		t.Fatalf("good probe refused: %v", err)
	}
}

func TestProbePatchRelocates(t *testing.T) {
	site := Site{Addr: 0xffffffffae4dcf74, Bytes: []byte{0x49, 0xc7, 0xc4, 0x40, 0x1c, 0x03, 0x00}} // mov $0x31c40,%r12
	p := &Probe{Actions: []Action{{ActEnter, tTimer}}}
	code, n, err := ProbePatch(tPatch, site, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := VerifyProbe(code, tPatch, n, p); err != nil {
		t.Fatal(err)
	}
	if err := VerifyRelocation(code[n:], tPatch+uint64(n), site); err != nil {
		t.Fatal(err)
	}
}
