package cfg

import (
	"debug/elf"
	"os/exec"
	"sort"
	"testing"

	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/elfsym"
)

// TestBoundariesMatchObjdumpLibc decodes every sized function of the
// system's libc (hand-written AVX2, EVEX and AVX-512 string functions
// among them) and compares the instruction boundaries with objdump's. The
// symbols are its separate debug file's when one is installed by build
// id (libc6-dbg: its static functions too), else its .dynsym's.
func TestBoundariesMatchObjdumpLibc(t *testing.T) {
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("objdump not installed")
	}
	const libc = "/lib/x86_64-linux-gnu/libc.so.6"
	f, err := elf.Open(libc)
	if err != nil {
		t.Skipf("no %s: %v", libc, err)
	}
	defer f.Close()
	syms, _ := f.DynamicSymbols()
	if id, err := elfsym.BuildID(f); err == nil {
		if df, err := elf.Open(debuginfo.BuildIDPath(id)); err == nil {
			if s, err := df.Symbols(); err == nil {
				syms = s
			}
			df.Close()
		}
	}
	text := f.Section(".text")
	data, err := text.Data()
	if err != nil {
		t.Fatal(err)
	}
	want := objdumpBoundaries(t, libc)
	sort.Slice(syms, func(i, j int) bool { return syms[i].Value < syms[j].Value })
	checked, bad := 0, 0
	for _, s := range syms {
		if elf.ST_TYPE(s.Info) != elf.STT_FUNC || s.Size == 0 || s.Value < text.Addr || s.Value+s.Size > text.Addr+text.Size {
			continue
		}
		fn, err := Decode(s.Name, "", s.Value, data[s.Value-text.Addr:s.Value-text.Addr+s.Size])
		if err != nil {
			t.Errorf("%s: %v", s.Name, err)
			continue
		}
		checked++
		for _, in := range fn.Insns {
			if !want[in.Addr] && bad < 20 {
				bad++
				t.Errorf("%s+%#x: we see an instruction (% x, %v), objdump does not", s.Name, in.Addr-s.Value, in.Bytes, in.Inst)
				break
			}
		}
	}
	if checked < 1000 {
		t.Errorf("only %d functions checked", checked)
	}
	t.Logf("%d functions of %s checked", checked, libc)
}

// TestDecodeVzeroupper: VEX vzeroupper and vzeroall have no ModRM (x86asm
// v0.32 takes the next byte for one when there is one).
func TestDecodeVzeroupper(t *testing.T) {
	for _, tc := range []struct {
		code []byte
		n    int
	}{
		{[]byte{0xc5, 0xf8, 0x77, 0xc3}, 3},       // vzeroupper; ret
		{[]byte{0xc5, 0xfc, 0x77, 0xc3}, 3},       // vzeroall; ret
		{[]byte{0xc4, 0xe1, 0x78, 0x77, 0xc3}, 4}, // vzeroupper, three-byte VEX; ret
	} {
		f, err := Decode("f", "", 0x1000, tc.code)
		if err != nil || len(f.Insns) != 2 || f.Insns[0].Len() != tc.n || f.Insns[1].Inst.Op.String() != "RET" {
			t.Errorf("% x: %v, %+v", tc.code, err, f)
		}
	}
}
