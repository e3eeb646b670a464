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
			n := 0
			for b.Loop() {
				if tab, err = Compile(f); err != nil {
					b.Fatal(err)
				}
				n++
			}
			// CPU time, unlike ns/op, does not grow when other processes
			// share the cores.
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/op")
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
