package elfsym

import (
	"bufio"
	"bytes"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
)

const cProgram = `
#include <stdio.h>
int counter = 3;
static int hidden[16];
const char greeting[] = "hello";
static int __attribute__((noinline)) helper(int x) { hidden[x & 15] += x; return hidden[x & 15]; }
int __attribute__((noinline)) work(int x) { return helper(x) + counter; }
int main(int argc, char **argv) { printf("%s %d\n", greeting, work(argc)); return 0; }
`

// buildC compiles cProgram with extra gcc flags.
func buildC(t *testing.T, flags ...string) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "prog.c")
	if err := os.WriteFile(src, []byte(cProgram), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "prog")
	args := append([]string{"-O2", "-g", "-o", out, src}, flags...)
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}
	return out
}

type nmSym struct {
	name string
	addr uint64
	size uint64
	kind Kind
}

// nmSymbols runs `nm -n --defined-only --format=sysv` (with -D for the
// dynamic table) and keeps the functions, indirect functions and objects
// that are not absolute: the oracle for Read.
func nmSymbols(t *testing.T, path string, dynamic bool) []nmSym {
	t.Helper()
	args := []string{"-n", "--defined-only", "--format=sysv"}
	if dynamic {
		args = append(args, "-D")
	}
	out, err := exec.Command("nm", append(args, path)...).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	var syms []nmSym
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Split(sc.Text(), "|")
		if len(f) != 7 {
			continue
		}
		var kind Kind
		switch typ := strings.TrimSpace(f[3]); typ {
		case "FUNC", "<OS specific>: 10": // STT_GNU_IFUNC is 10
			kind = Func
		case "OBJECT":
			kind = Object
		default:
			continue
		}
		if sec := strings.TrimSpace(f[6]); sec == "*ABS*" || sec == "*COM*" {
			continue
		}
		addr, err := strconv.ParseUint(strings.TrimSpace(f[1]), 16, 64)
		if err != nil {
			t.Fatalf("nm line %q: %v", sc.Text(), err)
		}
		var size uint64
		if s := strings.TrimSpace(f[4]); s != "" {
			size, _ = strconv.ParseUint(s, 16, 64)
		}
		name := strings.TrimSpace(f[0])
		if i := strings.IndexByte(name, '@'); i > 0 {
			name = name[:i]
		}
		syms = append(syms, nmSym{name, addr, size, kind})
	}
	return syms
}

func TestAgainstNM(t *testing.T) {
	libc := "/lib/x86_64-linux-gnu/libc.so.6"
	goBin := goBinary()
	for _, tc := range []struct {
		name    string
		path    func(t *testing.T) string
		source  string
		dynamic bool
	}{
		{"c-binary", func(t *testing.T) string { return buildC(t) }, ".symtab", false},
		{"c-pie-stripped", func(t *testing.T) string { return buildC(t, "-pie", "-fPIE", "-rdynamic", "-s") }, ".dynsym", true},
		{"libc", func(t *testing.T) string { return existing(t, libc) }, ".dynsym", true},
		{"go-binary", func(t *testing.T) string { return existing(t, goBin) }, ".symtab", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.path(t)
			tab, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			if tab.Source() != tc.source {
				t.Errorf("source %s, want %s", tab.Source(), tc.source)
			}
			want := nmSymbols(t, path, tc.dynamic)
			if len(want) == 0 {
				t.Fatal("nm lists no symbols")
			}
			if tab.Len() != len(want) {
				t.Errorf("%d symbols, nm lists %d", tab.Len(), len(want))
			}
			// Every nm symbol is in the table with its address, size and kind.
			have := make(map[nmSym]bool, tab.Len())
			for _, s := range tab.Symbols() {
				have[nmSym{s.Name, s.Addr, s.Size, s.Kind}] = true
			}
			atAddr := map[uint64][]string{}
			for _, s := range want {
				if !have[s] {
					t.Errorf("nm's %s %#x size %#x %v is missing", s.name, s.addr, s.size, s.kind)
				}
				atAddr[s.addr] = append(atAddr[s.addr], s.name)
			}
			// Lookup at each symbol's start and last byte names an alias
			// at that address (nm -n sorts; aliases share an address).
			for _, s := range want {
				got, off, ok := tab.Lookup(s.addr)
				if !ok || off != 0 || !contains(atAddr[s.addr], got.Name) {
					t.Errorf("Lookup(%#x) = %q+%#x %v, want one of %q", s.addr, got.Name, off, ok, atAddr[s.addr])
				}
				if s.size > 1 && len(atAddr[s.addr]) == 1 && !startsInside(want, s) {
					got, off, ok := tab.Lookup(s.addr + s.size - 1)
					if !ok || got.Name != s.name || off != s.size-1 {
						t.Errorf("Lookup(%#x) = %q+%#x %v, want %s+%#x", s.addr+s.size-1, got.Name, off, ok, s.name, s.size-1)
					}
				}
			}
			// Name → address for names nm lists once.
			count := map[string]int{}
			for _, s := range want {
				count[s.name]++
			}
			for _, s := range want {
				if count[s.name] != 1 {
					continue
				}
				if a, ok := tab.Addr(s.name); !ok || a != s.addr {
					t.Errorf("Addr(%q) = %#x %v, want %#x", s.name, a, ok, s.addr)
				}
			}
			if _, ok := tab.Addr("no such symbol"); ok {
				t.Error("Addr found a symbol that does not exist")
			}
			if want := readelfBuildID(t, path); tab.BuildID() != want {
				t.Errorf("build id %q, readelf -n says %q", tab.BuildID(), want)
			}
		})
	}
}

// goBinary is the go command: a large Go binary with a .symtab.
func goBinary() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func existing(t testing.TB, path string) string {
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s: %v", path, err)
	}
	return path
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// startsInside reports whether another symbol starts inside s.
func startsInside(all []nmSym, s nmSym) bool {
	for _, o := range all {
		if o.addr > s.addr && o.addr < s.addr+s.size {
			return true
		}
	}
	return false
}

var buildIDLine = regexp.MustCompile(`Build ID: ([0-9a-f]+)`)

func readelfBuildID(t *testing.T, path string) string {
	out, err := exec.Command("readelf", "-n", path).Output()
	if err != nil {
		t.Skipf("readelf: %v", err)
	}
	if m := buildIDLine.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return ""
}

func TestLookupOutside(t *testing.T) {
	tab := New([]Symbol{
		{Name: "b", Addr: 0x2000, Size: 0x10, Kind: Func, Bind: elf.STB_GLOBAL},
		{Name: "a", Addr: 0x1000, Size: 0x10, Kind: Func, Bind: elf.STB_LOCAL},
		{Name: "a_alias", Addr: 0x1000, Size: 0x10, Kind: Func, Bind: elf.STB_GLOBAL},
		{Name: "nosize", Addr: 0x3000, Kind: Object, Bind: elf.STB_GLOBAL},
	})
	for _, tc := range []struct {
		addr uint64
		name string
		off  uint64
		ok   bool
	}{
		{0xfff, "", 0, false},
		{0x1000, "a_alias", 0, true}, // global before local
		{0x100f, "a_alias", 0xf, true},
		{0x1010, "", 0, false}, // padding after a sized symbol
		{0x2008, "b", 8, true},
		{0x3000, "nosize", 0, true},
		{0x9000, "nosize", 0x6000, true}, // unsized: up to the next symbol
	} {
		s, off, ok := tab.Lookup(tc.addr)
		if s.Name != tc.name || off != tc.off || ok != tc.ok {
			t.Errorf("Lookup(%#x) = %q+%#x %v, want %q+%#x %v", tc.addr, s.Name, off, ok, tc.name, tc.off, tc.ok)
		}
	}
	if a, ok := tab.Addr("a"); !ok || a != 0x1000 {
		t.Errorf("Addr(a) = %#x %v", a, ok)
	}
}

// TestLoadBias maps libc in a real process (sleep) and checks that every
// mapping of libc in /proc/PID/maps gives the same bias, the address of
// the offset-0 mapping (libc is linked at 0).
func TestLoadBias(t *testing.T) {
	libc := existing(t, "/lib/x86_64-linux-gnu/libc.so.6")
	tab, err := Open(libc)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skipf("sleep: %v", err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	var maps []byte
	for i := 0; i < 200; i++ { // until the dynamic loader has mapped libc
		maps, err = os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/maps")
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(maps, []byte("libc.so.6")) {
			break
		}
		exec.Command("true").Run()
	}
	var base uint64
	var biases []uint64
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasSuffix(f[5], "libc.so.6") {
			continue
		}
		start, _ := strconv.ParseUint(strings.Split(f[0], "-")[0], 16, 64)
		off, _ := strconv.ParseUint(f[2], 16, 64)
		if off == 0 {
			base = start
		}
		b, err := tab.LoadBias(start, off)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		biases = append(biases, b)
	}
	if len(biases) < 3 {
		t.Fatalf("libc has %d mappings in\n%s", len(biases), maps)
	}
	for _, b := range biases {
		if b != base {
			t.Errorf("bias %#x, want %#x (all: %#x)", b, base, biases)
		}
	}
	if _, err := tab.LoadBias(0x1000, 1<<40); !errors.Is(err, ErrNotMapped) {
		t.Errorf("offset beyond the file: %v, want ErrNotMapped", err)
	}
}

// BenchmarkLookup is one address → symbol lookup in the go command's
// table (tens of thousands of symbols): a binary search, where procstat's
// linear search cost milliseconds per thread.
func BenchmarkLookup(b *testing.B) {
	tab, err := Open(existing(b, goBinary()))
	if err != nil {
		b.Fatal(err)
	}
	syms := tab.Symbols()
	addrs := make([]uint64, 1024)
	for i := range addrs {
		s := syms[i*len(syms)/len(addrs)]
		addrs[i] = s.Addr + s.Size/2
	}
	for i := 0; b.Loop(); i++ {
		tab.Lookup(addrs[i%len(addrs)])
	}
	b.ReportMetric(float64(tab.Len()), "symbols")
}

// TestMappingBiasSharedPage gives the mappings the kernel and ld.so make
// of LLD's layouts, where a segment starts in the last file page of the
// one before it (segments as readelf -l prints them for a C program linked
// by ld.lld 14 and for a Rust program linked by rust-lld). Every mapping
// must give the bias ld.so chose, the address of the first one; taking
// the first segment that maps the offset gives the executable mapping a
// bias one page too high.
func TestMappingBiasSharedPage(t *testing.T) {
	load := func(off, vaddr, filesz, memsz uint64, flags elf.ProgFlag) elf.ProgHeader {
		return elf.ProgHeader{Type: elf.PT_LOAD, Off: off, Vaddr: vaddr, Paddr: vaddr, Filesz: filesz, Memsz: memsz, Flags: flags, Align: 0x1000}
	}
	const r, rx, rw = elf.PF_R, elf.PF_R | elf.PF_X, elf.PF_R | elf.PF_W
	const base = 0x563a992b0000
	for _, tc := range []struct {
		name string
		segs Segments
		maps []Mapping
	}{
		{"c-lld", Segments{
			load(0, 0, 0x7ec, 0x7ec, r),
			load(0x7f0, 0x17f0, 0x230, 0x230, rx),
			load(0xa20, 0x2a20, 0x1d8, 0x1d8, rw),
			load(0xbf8, 0x3bf8, 0x60, 0x78, rw),
		}, []Mapping{
			{base, base + 0x1000, 0, "r--p"},
			{base + 0x1000, base + 0x2000, 0, "r-xp"},
			{base + 0x2000, base + 0x3000, 0, "r--p"}, // RELRO
			{base + 0x3000, base + 0x4000, 0, "rw-p"},
		}},
		{"rust-lld", Segments{
			load(0, 0, 0x15460, 0x15460, r),
			load(0x15460, 0x16460, 0x40f60, 0x40f60, rx),
			load(0x563c0, 0x583c0, 0x2bc8, 0x2c40, rw),
			load(0x58f88, 0x5bf88, 0xa00, 0xad2, rw),
		}, []Mapping{
			{base, base + 0x16000, 0, "r--p"},
			{base + 0x16000, base + 0x58000, 0x15000, "r-xp"},
			{base + 0x58000, base + 0x5b000, 0x56000, "r--p"},
			{base + 0x5b000, base + 0x5d000, 0x58000, "rw-p"},
		}},
	} {
		for _, m := range tc.maps {
			b, err := tc.segs.MappingBias(m, tc.maps)
			if err != nil || b != base {
				t.Errorf("%s: %#x-%#x %s %#x: bias %#x, %v; want %#x", tc.name, m.Start, m.End, m.Perms, m.Offset, b, err, uint64(base))
			}
			// Alone, only the executable mapping's permissions tell its
			// segment.
			if m.Perms[2] == 'x' {
				if b, err := tc.segs.MappingBias(m, nil); err != nil || b != base {
					t.Errorf("%s: alone, %#x-%#x %s %#x: bias %#x, %v; want %#x", tc.name, m.Start, m.End, m.Perms, m.Offset, b, err, uint64(base))
				}
			}
		}
	}
}
