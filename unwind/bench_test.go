package unwind

import (
	"debug/elf"
	"syscall"
	"testing"
	"time"
)

// cpuTime is the user and system CPU time of this process so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCompile measures unwind-table generation per system library
// from an open file (section reads included) and reports rows and bytes
// per row. Parca's figure for libpython is 17 ms.
func BenchmarkCompile(b *testing.B) {
	for _, lib := range systemLibraries {
		b.Run(lib.name, func(b *testing.B) {
			f, err := elf.Open(existing(b, lib.path))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			var tab *Table
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				if tab, err = Compile(f); err != nil {
					b.Fatal(err)
				}
			}
			// CPU time, unlike ns/op, does not grow when other processes
			// share the cores.
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(tab.Len()), "rows")
			b.ReportMetric(float64(RowBytes), "bytes/row")
			b.ReportMetric(float64(tab.Bytes()), "table-bytes")
		})
	}
}

// BenchmarkLookup is one pc lookup in libc's table.
func BenchmarkLookup(b *testing.B) {
	tab, err := Open(existing(b, systemLibraries[0].path))
	if err != nil {
		b.Fatal(err)
	}
	pcs := make([]uint64, 1024)
	for i := range pcs {
		pcs[i] = tab.Row(i*tab.Len()/len(pcs)).PC + 1
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		tab.Lookup(pcs[i%len(pcs)])
	}
}

// BenchmarkUnwindBlockedThread is the cost of one user stack of a thread
// blocked in read(2) in a binary without frame pointers: registers from
// /proc/PID/task/TID/syscall, memory through process_vm_readv, CFI rows
// from the cached tables; "symbolized" adds naming every frame.
func BenchmarkUnwindBlockedThread(b *testing.B) {
	pid := startBlocker(b, buildC(b, "-fomit-frame-pointer"))
	p, err := NewCache().Process(pid)
	if err != nil {
		b.Fatal(err)
	}
	for _, symbolize := range []bool{false, true} {
		name := "unwind"
		if symbolize {
			name = "symbolized"
		}
		b.Run(name, func(b *testing.B) {
			frames := 0
			cpu0 := cpuTime()
			for b.Loop() {
				regs, _, err := SyscallRegs(pid, pid)
				if err != nil {
					b.Fatal(err)
				}
				pcs := p.Unwind(regs, 0)
				if symbolize {
					for _, pc := range pcs {
						p.Symbolize(pc)
					}
				}
				frames = len(pcs)
			}
			if frames < 6 {
				b.Fatalf("only %d frames", frames)
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
			b.ReportMetric(float64(frames), "frames")
		})
	}
}
