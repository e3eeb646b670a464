package offcpu

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// cpuTime is the user plus system time of this process: on a shared,
// loaded machine it measures the sampler's work where wall time would
// measure the other tenants too.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSamplePass measures one sampling pass over a helper process
// with 500 threads blocked in pipe reads: state, kernel stack and (unless
// kernel-only) the CFI-unwound user stack of every thread, with
// aggregation. Symbolisation happens once per distinct stack, in Profile,
// and is measured by BenchmarkProfile. The figure to compare with
// procstat's 2.3 ms per thread is us/thread. The proc/ cases read the
// /proc files instead of the BPF task iterator.
func BenchmarkSamplePass(b *testing.B) {
	requireRoot(b)
	for _, tc := range []struct {
		name   string
		o      Options
		reread bool
		proc   bool // the /proc files, not the BPF task iterator
	}{
		// Threads that stayed blocked: after the first pass each costs a
		// syscall and a schedstat read (not scheduled since: same stacks).
		{"blocked/kernel+user", Options{}, false, false},
		// As if every thread had run since the last pass: state, kernel
		// stack and user stack are read and unwound afresh every time.
		{"reread/kernel+user", Options{}, true, false},
		{"reread/kernel-only", Options{KernelOnly: true}, true, false},
		{"reread/user-only", Options{UserOnly: true}, true, false},
		{"proc/blocked/kernel+user", Options{}, false, true},
		{"proc/reread/kernel+user", Options{}, true, true},
		{"proc/reread/kernel-only", Options{KernelOnly: true}, true, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			w := startWorkload(b, "500")
			o := tc.o
			o.PID = w.pid
			noTaskIter = tc.proc
			s, err := NewSampler(o, time.Second/9)
			noTaskIter = false
			if err != nil {
				b.Fatal(err)
			}
			if !tc.proc && s.iter == nil {
				b.Skip("the BPF task iterator does not load here")
			}
			defer s.Close()
			s.reread = tc.reread
			// The first pass opens descriptors and reads the helper's
			// files: the steady state is what a long profile pays.
			if _, err := s.Pass(); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime(b)
			threads := 0
			for b.Loop() {
				n, err := s.Pass()
				if err != nil {
					b.Fatal(err)
				}
				threads += n
			}
			b.StopTimer()
			cpu := cpuTime(b) - cpu0
			if threads > 0 {
				b.ReportMetric(float64(cpu.Microseconds())/float64(threads), "cpu-us/thread")
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(threads), "us/thread")
				b.ReportMetric(float64(threads)/float64(b.N), "threads/pass")
			}
			if p := s.Profile(); len(p.Stacks) == 0 {
				b.Fatal("no stacks sampled")
			}
		})
	}
}

// BenchmarkFirstPass is a pass that must open every thread's files and
// read the process's mappings and libraries (the cost of the first pass,
// or of a process seen for the first time).
func BenchmarkFirstPass(b *testing.B) {
	requireRoot(b)
	w := startWorkload(b, "500")
	b.ReportAllocs()
	threads := 0
	for b.Loop() {
		s, err := NewSampler(Options{PID: w.pid}, time.Second/9)
		if err != nil {
			b.Fatal(err)
		}
		n, err := s.Pass()
		if err != nil {
			b.Fatal(err)
		}
		threads += n
		s.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(threads), "us/thread")
}

// BenchmarkSymbolize names one sampled stack, kernel and user, as Profile
// does once per distinct stack: added to a pass's cost per thread, it is
// the worst case where every thread's stack is distinct.
func BenchmarkSymbolize(b *testing.B) {
	requireRoot(b)
	w := startWorkload(b)
	s, err := NewSampler(Options{TID: workloadTIDs(b, w.pid)["piper"]}, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Pass(); err != nil {
		b.Fatal(err)
	}
	if len(s.order) != 1 || len(s.order[0].user) == 0 {
		b.Fatalf("no user stack sampled: %+v", s.order)
	}
	e := s.order[0]
	e.kernelFrames() // loads kallsyms (once per process) for the task iterator's raw stacks
	b.ReportAllocs()
	frames := 0
	for b.Loop() {
		k := e.kernelFrames()
		u := names(e.userProc, e.user)
		frames += len(k) + len(u)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(frames), "ns/frame")
}
