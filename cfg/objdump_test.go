package cfg

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// TestBoundariesMatchObjdump decodes every function of a C program built
// at test time and compares the instruction boundaries with objdump's.
func TestBoundariesMatchObjdump(t *testing.T) {
	for _, tool := range []string{"gcc", "objdump"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	for _, opt := range []string{"-O0", "-O2", "-Os"} {
		bin := filepath.Join(t.TempDir(), "sample")
		if out, err := exec.Command("gcc", opt, "-fno-pie", "-no-pie", "-o", bin, "testdata/sample.c").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		want := objdumpBoundaries(t, bin)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		text := f.Section(".text")
		data, _ := text.Data()
		syms, _ := f.Symbols()
		checked := 0
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Size == 0 || s.Section == elf.SHN_UNDEF ||
				s.Value < text.Addr || s.Value+s.Size > text.Addr+text.Size {
				continue
			}
			code := data[s.Value-text.Addr : s.Value-text.Addr+s.Size]
			fn, err := Decode(s.Name, "", s.Value, code)
			if err != nil || fn.Truncated {
				t.Errorf("%s %s: decode: %v truncated=%v", opt, s.Name, err, fn != nil && fn.Truncated)
				continue
			}
			for _, in := range fn.Insns {
				if !want[in.Addr] {
					t.Errorf("%s %s: we see an instruction at %#x, objdump does not", opt, s.Name, in.Addr)
				}
			}
			n := 0
			for a := range want {
				if a >= s.Value && a < s.Value+s.Size {
					n++
				}
			}
			if n != len(fn.Insns) {
				t.Errorf("%s %s: %d instructions, objdump %d", opt, s.Name, len(fn.Insns), n)
			}
			checked++
		}
		if checked < 4 {
			t.Errorf("%s: only %d functions checked", opt, checked)
		}
	}
}

var objdumpLine = regexp.MustCompile(`^\s*([0-9a-f]+):\t`)

func objdumpBoundaries(t *testing.T, bin string) map[uint64]bool {
	out, err := exec.Command("objdump", "-d", "-w", "-j", ".text", bin).Output()
	if err != nil {
		t.Fatalf("objdump: %v", err)
	}
	m := make(map[uint64]bool)
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if g := objdumpLine.FindStringSubmatch(sc.Text()); g != nil {
			a, _ := strconv.ParseUint(g[1], 16, 64)
			m[a] = true
		}
	}
	return m
}
