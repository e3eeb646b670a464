package kernel

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// nmSym is one function as `nm --format=sysv` prints it.
type nmSym struct {
	name    string
	value   uint64
	local   bool
	section string
}

// nmFunctions is the oracle: nm's defined FUNC symbols of a file.
func nmFunctions(t *testing.T, path string) []nmSym {
	t.Helper()
	out, err := exec.Command("nm", "--format=sysv", "--defined-only", path).Output()
	if err != nil {
		t.Fatalf("nm: %v", err)
	}
	var syms []nmSym
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != 7 || strings.TrimSpace(f[3]) != "FUNC" {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimSpace(f[1]), 16, 64)
		if err != nil {
			t.Fatalf("nm line %q: %v", sc.Text(), err)
		}
		class := strings.TrimSpace(f[2])
		syms = append(syms, nmSym{name: strings.TrimSpace(f[0]), value: v, local: class == strings.ToLower(class), section: strings.TrimSpace(f[6])})
	}
	if len(syms) < 4 {
		t.Fatalf("nm lists only %d functions in %s", len(syms), path)
	}
	return syms
}

func symbolSet(s *Symbols) []string {
	var out []string
	for _, sym := range s.byAddr {
		out = append(out, fmt.Sprintf("%s %#x %c %s", sym.Name, sym.Addr, sym.Type, sym.Module))
	}
	slices.Sort(out)
	return out
}

// TestSymbolsFromELF builds an executable (a vmlinux stands for one) and a
// relocatable object with a section per function (as a module .ko is), and
// checks the symbols placed from each against nm's.
func TestSymbolsFromELF(t *testing.T) {
	for _, tool := range []string{"gcc", "nm"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	dir := t.TempDir()
	exe, obj := filepath.Join(dir, "sample"), filepath.Join(dir, "sample.o")
	for _, args := range [][]string{
		{"-O2", "-fno-pie", "-no-pie", "-o", exe, "../cfg/testdata/sample.c"},
		{"-O2", "-c", "-ffunction-sections", "-o", obj, "../cfg/testdata/sample.c"},
	} {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}

	const slide = 0xffffffff80000000
	s, err := SymbolsFromELF(exe, ELFOptions{Slide: slide})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range nmFunctions(t, exe) {
		typ := 'T'
		if n.local {
			typ = 't'
		}
		want = append(want, fmt.Sprintf("%s %#x %c ", n.name, n.value+slide, typ))
	}
	slices.Sort(want)
	if got := symbolSet(s); !slices.Equal(got, want) {
		t.Errorf("executable:\n got %q\nwant %q", got, want)
	}
	if sym, _, err := s.Lookup("main"); err != nil || sym.Type != 'T' {
		t.Errorf("Lookup(main) = %+v, %v", sym, err)
	}

	// The object: every section placed 4 KiB apart, like a module's.
	f, err := elf.Open(obj)
	if err != nil {
		t.Fatal(err)
	}
	bases := map[string]uint64{}
	for i, sec := range f.Sections {
		bases[sec.Name] = 0xffffffffc0100000 + uint64(i)<<12
	}
	f.Close()
	if _, err := SymbolsFromELF(obj, ELFOptions{Module: "sample"}); !errors.Is(err, ErrNoSectionBase) {
		t.Errorf("object without section bases: %v, want ErrNoSectionBase", err)
	}
	m, err := SymbolsFromELF(obj, ELFOptions{Module: "sample", SectionBase: func(name string) (uint64, bool) {
		b, ok := bases[name]
		return b, ok
	}})
	if err != nil {
		t.Fatal(err)
	}
	want = want[:0]
	for _, n := range nmFunctions(t, obj) {
		typ := 'T'
		if n.local {
			typ = 't'
		}
		want = append(want, fmt.Sprintf("%s %#x %c sample", n.name, bases[n.section]+n.value, typ))
	}
	slices.Sort(want)
	if got := symbolSet(m); !slices.Equal(got, want) {
		t.Errorf("object:\n got %q\nwant %q", got, want)
	}

	// Merged, the core kernel's name wins a lookup, as with kallsyms.
	all := MergeSymbols(s, m)
	if all.Len() != s.Len()+m.Len() {
		t.Errorf("merged %d symbols, want %d", all.Len(), s.Len()+m.Len())
	}
	if sym, amb, err := all.Lookup("main"); err != nil || sym.Module != "" || amb != 2 {
		t.Errorf("merged Lookup(main) = %+v, %d, %v; want the executable's, ambiguous 2", sym, amb, err)
	}
}
