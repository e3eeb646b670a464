package unwind

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kinst/kinst/internal/elfsym"
)

// readelfHeader returns a field of `readelf -h` ("Start of section
// headers", ...) as a number.
func readelfHeader(t *testing.T, path, field string) uint64 {
	t.Helper()
	out, err := exec.Command("readelf", "-h", path).Output()
	if err != nil {
		t.Skipf("readelf -h: %v", err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(field) + `:\s+(\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("readelf -h %s: no %q in\n%s", path, field, out)
	}
	v, _ := strconv.ParseUint(string(m[1]), 10, 64)
	return v
}

// readelfSection returns the file offset of a section from `readelf -S -W`.
func readelfSection(t *testing.T, path, name string) (off uint64) {
	t.Helper()
	out, err := exec.Command("readelf", "-S", "-W", path).Output()
	if err != nil {
		t.Skipf("readelf -S: %v", err)
	}
	m := regexp.MustCompile(`(?m)\]\s+` + regexp.QuoteMeta(name) + `\s+\S+\s+[0-9a-f]+\s+([0-9a-f]+)\s+([0-9a-f]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("readelf -S %s: no section %s", path, name)
	}
	off, _ = strconv.ParseUint(string(m[1]), 16, 64)
	return off
}

// TestBadFileErrors: every bad input names the file and says what is
// wrong and where, matches its sentinel, and gives the same error through
// the process cache that `unwind stack` and `offcpu` open files with.
// The truncated copies are cut from the machine's libc at test time; the
// offsets expected come from readelf on the whole library.
func TestBadFileErrors(t *testing.T) {
	libc := existing(t, systemLibraries[0].path)
	whole, err := os.ReadFile(libc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shoff := readelfHeader(t, libc, "Start of section headers")
	shnum := readelfHeader(t, libc, "Number of section headers")
	shentsize := readelfHeader(t, libc, "Size of section headers")
	phoff := readelfHeader(t, libc, "Start of program headers")
	phsize := readelfHeader(t, libc, "Size of program headers") * readelfHeader(t, libc, "Number of program headers")
	truncated := func(n int) string {
		return fmt.Sprintf("truncated: section headers at %#x needs %#x bytes, file has %#x", shoff, shnum*shentsize, n)
	}

	// A whole libc whose .eh_frame header claims more bytes than the file has.
	ef, err := elf.Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	ehIdx := -1
	for i, s := range ef.Sections {
		if s.Name == ".eh_frame" {
			ehIdx = i
		}
	}
	ef.Close()
	if ehIdx < 0 {
		t.Fatal("libc has no .eh_frame")
	}
	ehOff := readelfSection(t, libc, ".eh_frame")
	long := append([]byte(nil), whole...)
	ehSize := uint64(len(whole)) // runs past the end from ehOff
	binary.LittleEndian.PutUint64(long[shoff+uint64(ehIdx)*shentsize+32:], ehSize)

	objNoCFI := ""
	if _, err := exec.LookPath("gcc"); err == nil {
		objNoCFI = filepath.Join(dir, "nocfi.o")
		if b, err := exec.Command("gcc", "-O2", "-c", "-fno-asynchronous-unwind-tables", "-fno-unwind-tables",
			"-o", objNoCFI, "testdata/blocker.c").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, b)
		}
	}

	// An object whose first .eh_frame relocation has a type no CFI
	// needs (R_X86_64_GOTPCREL): refused, not compiled wrongly.
	objBadRel := ""
	if objNoCFI != "" {
		obj := filepath.Join(dir, "drap.o")
		if b, err := exec.Command("gcc", "-O2", "-c", "-o", obj, "testdata/drap.c").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, b)
		}
		b, err := os.ReadFile(obj)
		if err != nil {
			t.Fatal(err)
		}
		relaOff := readelfSection(t, obj, ".rela.eh_frame")
		b[relaOff+8] = byte(elf.R_X86_64_GOTPCREL)
		objBadRel = write("badrel.o", b)
	}

	for _, tc := range []struct {
		name, path string
		is         error
		msg        string // the whole message after "PATH: "
	}{
		{"six-bytes-of-libc", write("six", whole[:6]), elfsym.ErrTruncated, "truncated: ELF identification at 0x0 needs 0x10 bytes, file has 0x6"},
		{"six-bytes-of-text", write("text6", []byte("hello\n")), elfsym.ErrNotELF, "not an ELF file (starts with 68 65 6c 6c, not 7f 45 4c 46)"},
		{"empty", write("empty", nil), elfsym.ErrNotELF, "not an ELF file (empty)"},
		{"dev-null", "/dev/null", elfsym.ErrNotELF, "not an ELF file (empty)"},
		{"directory", dir, elfsym.ErrNotELF, "not an ELF file (a directory)"},
		{"libc-100-bytes", write("libc.so.6-100", whole[:100]), elfsym.ErrTruncated,
			fmt.Sprintf("truncated: program headers at %#x needs %#x bytes, file has 0x64", phoff, phsize)},
		{"libc-5K", write("libc.so.6-5K", whole[:5000]), elfsym.ErrTruncated, truncated(5000)},
		{"libc-100K", write("libc.so.6-100K", whole[:100000]), elfsym.ErrTruncated, truncated(100000)},
		{"libc-500K", write("libc.so.6-500K", whole[:500000]), elfsym.ErrTruncated, truncated(500000)},
		{"libc-1.9M", write("libc.so.6-1.9M", whole[:1900000]), elfsym.ErrTruncated, truncated(1900000)},
		{"libc-eh_frame-past-end", write("libc.so.6-long-eh", long), elfsym.ErrTruncated,
			fmt.Sprintf("truncated: section .eh_frame at %#x needs %#x bytes, file has %#x", ehOff, ehSize, len(whole))},
		{"object-without-cfi", objNoCFI, ErrNoCFI, "no .eh_frame or .debug_frame section"},
		{"object-bad-relocation", objBadRel, ErrRelocation, ".rela.eh_frame entry 0 (at 0x20): relocation type R_X86_64_GOTPCREL is not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.path == "" {
				t.Skip("gcc not installed")
			}
			want := tc.path + ": " + tc.msg
			_, err := Open(tc.path)
			if err == nil || err.Error() != want || !errors.Is(err, tc.is) {
				t.Errorf("Open: %v\nwant %s (matching %v)", err, want, tc.is)
			}
			_, err = elfsym.Open(tc.path)
			if tc.is != ErrNoCFI && tc.is != ErrRelocation && (err == nil || err.Error() != want || !errors.Is(err, tc.is)) {
				t.Errorf("elfsym.Open: %v\nwant %s", err, want)
			}
			f, err := NewCache().Open(tc.path)
			if tc.is == ErrNoCFI {
				if err != nil || f.Table != nil {
					t.Errorf("Cache.Open: %v, table %v; want no error and no table", err, f)
				}
				return
			}
			if err == nil || err.Error() != want || !errors.Is(err, tc.is) {
				t.Errorf("Cache.Open: %v\nwant %s", err, want)
			}
			if strings.Contains(err.Error(), "EOF") {
				t.Errorf("bare EOF in %q", err)
			}
		})
	}
}
