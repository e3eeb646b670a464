package unwind

import (
	"debug/elf"
	"testing"
)

// BenchmarkCompileLibc measures unwind-table generation for libc from an
// open file (section reads included), and reports rows and bytes per row.
// Parca's figure for libpython is 17 ms.
func BenchmarkCompileLibc(b *testing.B) {
	f, err := elf.Open(existing(b, systemLibraries[0].path))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var tab *Table
	b.ReportAllocs()
	for b.Loop() {
		if tab, err = Compile(f); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(tab.Len()), "rows")
	b.ReportMetric(float64(RowBytes), "bytes/row")
	b.ReportMetric(float64(tab.Bytes()), "table-bytes")
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
