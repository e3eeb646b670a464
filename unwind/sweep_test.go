package unwind

import (
	"debug/elf"
	"os"
	"path/filepath"
	"testing"
)

// TestSweepMatchesReadelf compares every ELF file matched by the glob in
// KINST_UNWIND_SWEEP with readelf, e.g.
//
//	KINST_UNWIND_SWEEP='/usr/lib/x86_64-linux-gnu/*.so*' go test ./unwind -run Sweep
//
// It is off by default: a whole system takes minutes.
func TestSweepMatchesReadelf(t *testing.T) {
	glob := os.Getenv("KINST_UNWIND_SWEEP")
	if glob == "" {
		t.Skip("set KINST_UNWIND_SWEEP to a glob of ELF files")
	}
	paths, err := filepath.Glob(glob)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range paths {
		f, err := elf.Open(path)
		if err != nil {
			continue // not ELF
		}
		ok := f.Machine == elf.EM_X86_64 && (f.Section(".eh_frame") != nil || f.Section(".debug_frame") != nil)
		f.Close()
		if !ok {
			continue
		}
		if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSymlink != 0 {
			continue
		}
		n++
		t.Run(filepath.Base(path), func(t *testing.T) {
			if len(readelfFDEs(t, path)) == 0 { // an empty .eh_frame
				if tab, err := Open(path); err != nil || tab.FDEs != 0 {
					t.Errorf("readelf shows no FDEs; Open: %v", err)
				}
				return
			}
			compareWithReadelf(t, path)
		})
	}
	t.Logf("%d files compared", n)
}
