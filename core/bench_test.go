package core

import (
	"os"
	"testing"
)

// BenchmarkTasksAndStacks opens the dump named by KINST_CORE and lists
// and unwinds every task, as `kinst core DUMP ps` and `bt -a` do.
func BenchmarkTasksAndStacks(b *testing.B) {
	path := os.Getenv("KINST_CORE")
	if path == "" {
		b.Skip("set KINST_CORE to a vmcore")
	}
	for b.Loop() {
		k, err := Open(path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		ts, err := k.Tasks()
		if err != nil {
			b.Fatal(err)
		}
		for _, t := range ts {
			if _, err := k.Backtrace(t); err != nil {
				b.Fatal(err)
			}
		}
		k.Close()
	}
}
