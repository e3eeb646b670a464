package linux

import (
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestNOBITS assembles an object with a page of int3 in a section between
// others, rewrites it, and checks with debug/elf and readelf (the oracle)
// that the section is NOBITS of the same size and every other section's
// bytes are as before.
func TestNOBITS(t *testing.T) {
	if _, err := exec.LookPath("as"); err != nil {
		t.Skip("no assembler")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "h.s")
	obj := filepath.Join(dir, "h.o")
	os.WriteFile(src, []byte(`
	.text
	.globl f
f:	ret
	.section .text.kinst_heap,"ax",@progbits
	.balign 4096
heap:	.fill 8192,1,0xcc
	.data
	.quad heap
	.quad f
	.section .rodata
	.ascii "after the heap"
`), 0o644)
	if out, err := exec.Command("as", "-o", obj, src).CombinedOutput(); err != nil {
		t.Fatalf("as: %v\n%s", err, out)
	}
	before := sections(t, obj)
	fi0, _ := os.Stat(obj)
	if err := makeNOBITS(obj, heapSection); err != nil {
		t.Fatal(err)
	}
	fi1, _ := os.Stat(obj)
	if fi0.Size()-fi1.Size() != 8192 {
		t.Errorf("file shrank by %d bytes, want 8192", fi0.Size()-fi1.Size())
	}
	after := sections(t, obj)
	for name, s0 := range before {
		s1, ok := after[name]
		switch {
		case !ok:
			t.Errorf("section %s gone", name)
		case name == heapSection:
			if s1.typ != elf.SHT_NOBITS || s1.size != s0.size || s1.flags != s0.flags {
				t.Errorf("%s: %v size %d flags %v, want NOBITS size %d flags %v", name, s1.typ, s1.size, s1.flags, s0.size, s0.flags)
			}
		case !bytes.Equal(s0.data, s1.data) || s0.typ != s1.typ:
			t.Errorf("section %s changed", name)
		}
	}
	if out, err := exec.Command("readelf", "-SW", obj).CombinedOutput(); err != nil || !bytes.Contains(out, []byte("NOBITS")) {
		t.Errorf("readelf: %v\n%s", err, out)
	}
	// Again: already NOBITS, nothing to do.
	if err := makeNOBITS(obj, heapSection); err != nil {
		t.Error(err)
	}
	if err := makeNOBITS(obj, ".text.nonesuch"); err == nil {
		t.Error("a missing section was not an error")
	}
	os.WriteFile(obj, []byte("\x7fELF garbage"), 0o644)
	if err := makeNOBITS(obj, heapSection); err == nil {
		t.Error("a corrupt file was not an error")
	}
}

type section struct {
	typ   elf.SectionType
	flags elf.SectionFlag
	size  uint64
	data  []byte
}

func sections(t *testing.T, path string) map[string]section {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m := map[string]section{}
	for _, s := range f.Sections {
		var d []byte
		if s.Type != elf.SHT_NOBITS {
			d, _ = s.Data()
		}
		m[s.Name] = section{s.Type, s.Flags, s.Size, d}
	}
	return m
}
