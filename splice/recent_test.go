package splice

import (
	"testing"

	"github.com/kinst/kinst/kernel"
)

// countingText serves a run of nops and counts the reads.
type countingText struct{ reads int }

func (c *countingText) Read(addr uint64, b []byte) error {
	c.reads++
	for i := range b {
		b[i] = 0x90
	}
	return nil
}

func TestRecentFunctions(t *testing.T) {
	const base = 0xffffffff81000000
	var syms []kernel.Symbol
	for i := range 12 {
		syms = append(syms, kernel.Symbol{Addr: base + uint64(i)*16, Size: 16, Name: string(rune('a' + i)), Type: 't'})
	}
	snap := kernel.NewSymbols(syms)
	var r recentFunctions
	text := &countingText{}
	read := func(s *kernel.Symbols, i int) {
		t.Helper()
		fn, err := r.read(text, s, syms[i])
		if err != nil || fn.Addr != syms[i].Addr || fn.Name != syms[i].Name {
			t.Fatalf("read %s: %v, %+v", syms[i].Name, err, fn)
		}
	}
	for _, step := range []struct {
		what  string
		snap  *kernel.Symbols
		fn    int
		reads int // total reads after the step
	}{
		{"first read decodes", snap, 0, 1},
		{"again: kept", snap, 0, 1},
		{"a neighbour", snap, 1, 2},
		{"the first still kept", snap, 0, 2},
		{"another snapshot reads again", kernel.NewSymbols(syms), 0, 3},
	} {
		read(step.snap, step.fn)
		if text.reads != step.reads {
			t.Errorf("%s: %d reads, want %d", step.what, text.reads, step.reads)
		}
	}
	// Past its capacity the oldest goes.
	snap = kernel.NewSymbols(syms)
	text.reads = 0
	for i := range recentCap + 1 {
		read(snap, i)
	}
	read(snap, recentCap) // newest: kept
	read(snap, 0)         // evicted: read again
	if want := recentCap + 2; text.reads != want {
		t.Errorf("%d reads, want %d", text.reads, want)
	}
	// Without a ring (a process's facts), every read decodes.
	var none *recentFunctions
	text.reads = 0
	for range 2 {
		if _, err := none.read(text, snap, syms[0]); err != nil {
			t.Fatal(err)
		}
	}
	if text.reads != 2 {
		t.Errorf("nil ring: %d reads, want 2", text.reads)
	}
}
