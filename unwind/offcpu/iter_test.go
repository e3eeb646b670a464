package offcpu

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTaskIterMatchesProc samples the workload through the BPF task
// iterator and through the /proc files, one pass each, and requires the
// same state, kernel stack (kallsyms names of raw addresses against the
// kernel's own /proc text) and user stack for the threads that stay
// blocked in one place.
func TestTaskIterMatchesProc(t *testing.T) {
	requireRoot(t)
	w := startWorkload(t)
	pass := func(proc bool) map[string]Stack {
		t.Helper()
		noTaskIter = proc
		defer func() { noTaskIter = false }()
		s, err := NewSampler(Options{PID: w.pid}, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if (s.iter == nil) != proc {
			if !proc {
				t.Skip("the BPF task iterator does not load here")
			}
			t.Fatal("a sampler with the task iterator turned off has one")
		}
		if _, err := s.Pass(); err != nil {
			t.Fatal(err)
		}
		out := map[string]Stack{}
		for _, st := range s.Profile().Stacks {
			out[st.Group] = st
		}
		return out
	}
	for try := 0; ; try++ {
		it, proc := pass(false), pass(true)
		var diffs []string
		for _, name := range []string{"sleeper", "piper", "futexer"} {
			a, b := it[name], proc[name]
			if a.State != b.State || !slices.Equal(a.Kernel, b.Kernel) || !slices.Equal(a.User, b.User) || len(a.Kernel) == 0 || len(a.User) == 0 {
				diffs = append(diffs, name+":\n  iterator "+a.State+" "+strings.Join(a.Kernel, ";")+" | "+strings.Join(a.User, ";")+
					"\n  /proc    "+b.State+" "+strings.Join(b.Kernel, ";")+" | "+strings.Join(b.User, ";"))
			}
		}
		if len(diffs) == 0 {
			t.Logf("sleeper: %v %v", it["sleeper"].Kernel, it["sleeper"].User)
			return
		}
		// piper and futexer wake every 250 ms: a pass may catch one
		// running. Three tries.
		if try == 2 {
			t.Fatalf("the task iterator and /proc disagree:\n%s", strings.Join(diffs, "\n"))
		}
		time.Sleep(30 * time.Millisecond)
	}
}
