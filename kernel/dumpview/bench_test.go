package dumpview

import (
	"os"
	"testing"
)

// BenchmarkSymbols decodes kallsyms from the dump named by KINST_CORE
// (a real vmcore; skipped without one).
func BenchmarkSymbols(b *testing.B) {
	path := os.Getenv("KINST_CORE")
	if path == "" {
		b.Skip("set KINST_CORE to a vmcore")
	}
	k, err := Open(path, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	for b.Loop() {
		if _, err := k.loadKallsyms(); err != nil {
			b.Fatal(err)
		}
	}
}
