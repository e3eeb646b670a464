package offcpu

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCompleteUser(t *testing.T) {
	cfi := []sampledUser{
		{frames: []string{"read", "read_pipe", "piper_main", "start_thread", "clone3"}, samples: 9},
		{frames: []string{"read", "other_reader", "main"}, samples: 3},
		{frames: []string{"nanosleep", "sleep_forever", "sleeper_main", "start_thread", "clone3"}, samples: 5},
	}
	tests := []struct {
		name            string
		fp              []string
		want            []string
		cut, completed  bool
		sampled         []sampledUser
		wantUnsampled   bool // no sampled stacks: left as it is
		wantCutNoSample bool
	}{
		{name: "unknown end completed from the most sampled agreeing stack",
			fp:   []string{"read", "[unknown]"},
			want: []string{"read", "read_pipe", "piper_main", "start_thread", "clone3"}, cut: true, completed: true},
		{name: "the agreeing prefix decides before the samples",
			fp:   []string{"read", "other_reader", "[unknown]"},
			want: []string{"read", "other_reader", "main"}, cut: true, completed: true},
		{name: "a wrong frame before [unknown] is replaced",
			fp:   []string{"read", "garbage", "[unknown]"},
			want: []string{"read", "read_pipe", "piper_main", "start_thread", "clone3"}, cut: true, completed: true},
		{name: "a prefix of a sampled stack is extended",
			fp:   []string{"nanosleep", "sleep_forever"},
			want: []string{"nanosleep", "sleep_forever", "sleeper_main", "start_thread", "clone3"}, cut: true, completed: true},
		{name: "a whole stack stays",
			fp:   []string{"read", "read_pipe", "piper_main", "start_thread", "clone3"},
			want: []string{"read", "read_pipe", "piper_main", "start_thread", "clone3"}},
		{name: "a stack that went on differently is trusted",
			fp:   []string{"read", "elsewhere", "main"},
			want: []string{"read", "elsewhere", "main"}},
		{name: "no agreeing innermost frame: left cut",
			fp:   []string{"futex_wait", "[unknown]"},
			want: []string{"futex_wait", "[unknown]"}, cut: true},
		{name: "nothing sampled: left cut",
			fp:   []string{"read", "[unknown]"},
			want: []string{"read", "[unknown]"}, cut: true,
			sampled: []sampledUser{}},
	}
	for _, tc := range tests {
		sampled := cfi
		if tc.sampled != nil {
			sampled = tc.sampled
		}
		got, cut, completed := completeUser(tc.fp, sampled)
		if !slices.Equal(got, tc.want) || cut != tc.cut || completed != tc.completed {
			t.Errorf("%s: %v → %v cut=%v completed=%v, want %v cut=%v completed=%v", tc.name, tc.fp, got, cut, completed, tc.want, tc.cut, tc.completed)
		}
	}
}

// TestTraceCompletesUserStacks traces the workload built without frame
// pointers: BPF's user stacks of its piper and futexer threads stop in
// libc's wrappers. Traced alone piper's is counted as cut; with a sampler
// beside the tracer they are completed with the CFI-unwound callers the
// workload's source gives (read_pipe ← piper_main, wait_futex ←
// futexer_main).
func TestTraceCompletesUserStacks(t *testing.T) {
	requireRoot(t)
	w := startWorkload(t)
	want := map[string][]string{"piper": {"read_pipe", "piper_main"}, "futexer": {"wait_futex", "futexer_main"}}
	has := func(p *Profile, thread string) (named, cut int) {
		for _, s := range p.Stacks {
			if s.Group != thread || len(s.User) == 0 {
				continue
			}
			if s.UserError == errUserCut {
				cut++
			}
			i := slices.Index(s.User, want[thread][0])
			if i >= 0 && i+1 < len(s.User) && s.User[i+1] == want[thread][1] {
				named++
			}
		}
		return
	}
	run := func(complete bool) *Profile {
		o := Options{PID: w.pid}
		tr := startTracer(t, TraceOptions{Options: o})
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		if complete {
			so := o
			so.UserOnly = true
			s, err := NewSampler(so, 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			tr.CompleteFrom(s)
			if err := s.Run(ctx, 0, nil); err != nil {
				t.Fatal(err)
			}
		} else {
			<-ctx.Done()
		}
		p, err := tr.Profile()
		if err != nil {
			t.Fatal(err)
		}
		tr.Close()
		for _, s := range p.Stacks {
			if want[s.Group] != nil {
				t.Logf("complete=%v %s: %s [%s]", complete, s.Group, strings.Join(s.User, " ← "), s.UserError)
			}
		}
		return p
	}
	alone := run(false)
	// piper's walk leaves the mapped files ("[unknown]": known to be
	// cut); futexer's ends on a zero frame pointer inside libc, which
	// looks like the end of a stack until a sampled one goes further.
	for thread := range want {
		if named, cut := has(alone, thread); named > 0 || (thread == "piper" && cut == 0) {
			t.Errorf("traced alone: %s: %d stacks name %v, %d cut; want none named and piper's cut (is the workload built with frame pointers?)", thread, named, want[thread], cut)
		}
	}
	if alone.UserCut == 0 || alone.UserCompleted != 0 {
		t.Errorf("traced alone: %d cut, %d completed", alone.UserCut, alone.UserCompleted)
	}
	with := run(true)
	for thread := range want {
		if named, cut := has(with, thread); named == 0 || cut > 0 {
			t.Errorf("with the sampler: %s: %d stacks name %v, %d left cut", thread, named, want[thread], cut)
		}
	}
	if with.UserCompleted == 0 {
		t.Errorf("with the sampler: none of %d stacks completed (%d cut)", len(with.Stacks), with.UserCut)
	}
}
