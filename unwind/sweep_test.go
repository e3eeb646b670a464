package unwind

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestSweepMatchesReadelf compares every ELF file matched by the glob in
// KINST_UNWIND_SWEEP with readelf, e.g.
//
//	KINST_UNWIND_SWEEP='/usr/lib/x86_64-linux-gnu/*.so*' go test ./unwind -run Sweep
//
// Symbolic links are followed (a file reached by several is compared
// once), and a glob that gives no x86-64 ELF file with CFI fails. It is
// off by default: a whole system takes minutes.
func TestSweepMatchesReadelf(t *testing.T) {
	glob := os.Getenv("KINST_UNWIND_SWEEP")
	if glob == "" {
		t.Skip("set KINST_UNWIND_SWEEP to a glob of ELF files")
	}
	paths, err := sweepFiles(glob)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range paths {
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
	t.Logf("%d files compared", len(paths))
}

// sweepFiles returns the x86-64 ELF files with CFI that glob matches,
// following symbolic links, each real file once (by its resolved path),
// in glob order. Matching none is an error: a sweep that compares
// nothing must not pass.
func sweepFiles(glob string) ([]string, error) {
	matches, err := filepath.Glob(glob)
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range matches {
		path, err := filepath.EvalSymlinks(m)
		if err != nil || seen[path] {
			continue // a dangling link, or a file already taken
		}
		seen[path] = true
		if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		f, err := elf.Open(path)
		if err != nil {
			continue // not ELF
		}
		ok := f.Machine == elf.EM_X86_64 && (f.Section(".eh_frame") != nil || f.Section(".debug_frame") != nil)
		f.Close()
		if ok {
			out = append(out, path)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("KINST_UNWIND_SWEEP=%s: %w (of %d paths matched)", glob, errNoSweepFiles, len(matches))
	}
	return out, nil
}

var errNoSweepFiles = errors.New("no x86-64 ELF file with .eh_frame or .debug_frame: nothing to compare")

// TestSweepFiles gives the sweep a directory of symbolic links only: to
// libc, to that link, to libc again, to a text file and to nothing. The
// sweep must compare libc once, by its real path (the oracle:
// filepath.EvalSymlinks and readelf's view that libc has .eh_frame), and
// a glob of nothing but the text file must fail.
func TestSweepFiles(t *testing.T) {
	libc := existing(t, systemLibraries[0].path)
	real, err := filepath.EvalSymlinks(libc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	text := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(text, []byte("not ELF\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]string{
		"a.so":        libc,
		"b.so":        filepath.Join(dir, "a.so"),
		"c.so":        real,
		"d.so":        text,
		"dangling.so": filepath.Join(dir, "missing"),
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := sweepFiles(filepath.Join(dir, "*.so"))
	if err != nil || !slices.Equal(got, []string{real}) {
		t.Errorf("sweepFiles(%s/*.so) = %q, %v; want [%s]", dir, got, err, real)
	}
	if got, err := sweepFiles(filepath.Join(dir, "d.so")); !errors.Is(err, errNoSweepFiles) || got != nil {
		t.Errorf("a glob of a text file: %q, %v; want an error", got, err)
	}
	if got, err := sweepFiles(filepath.Join(dir, "nothing*")); !errors.Is(err, errNoSweepFiles) || got != nil {
		t.Errorf("a glob of nothing: %q, %v; want an error", got, err)
	}
}
