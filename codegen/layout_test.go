package codegen

import (
	"testing"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// modrmForms are ModRM (+SIB, displacement) tails: RIP-relative,
// SIB-absolute, register, and base+disp8.
var modrmForms = [][]byte{
	{0x05, 0x78, 0x56, 0x34, 0x12},
	{0x04, 0x25, 0x78, 0x56, 0x34, 0x12},
	{0xc1},
	{0x45, 0x10},
	{0x15, 0x00, 0x01, 0x00, 0x00}, // reg field 2, RIP-relative
	{0x25, 0x00, 0x01, 0x00, 0x00}, // reg field 4, RIP-relative
	{0x3d, 0xf0, 0xff, 0xff, 0xff}, // reg field 7, RIP-relative
}

var filler = []byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa}

// layoutAgrees checks parseLayout against x86asm on one encoding that
// x86asm decodes: they must find the same RIP-relative displacement (for
// VEX, where x86asm shows it as an absolute address, the same value).
func layoutAgrees(t *testing.T, enc []byte) {
	t.Helper()
	inst, err := x86dec.Decode(enc)
	if err != nil || inst.Op == 0 {
		return
	}
	b := enc[:inst.Len]
	l, err := parseLayout(b)
	if err != nil {
		t.Errorf("% x (%s): %v", b, gnu(inst, 0), err)
		return
	}
	want := -1
	for _, a := range inst.Args {
		if m, ok := a.(x86asm.Mem); ok {
			switch {
			case m.Base == x86asm.RIP:
				want = inst.PCRelOff
			case m.Base == 0 && m.Index == 0 && l.vex && l.rip >= 0 && int32(m.Disp) == le32(b, l.rip):
				want = l.rip
			}
		}
	}
	if l.rip != want {
		t.Errorf("% x (%s): RIP-relative disp at %d, x86asm says %d", b, gnu(inst, 0), l.rip, want)
	}
	if l.modrm >= len(b) || l.opcode >= len(b) {
		t.Errorf("% x (%s): opcode %d, ModRM %d beyond the instruction", b, gnu(inst, 0), l.opcode, l.modrm)
	}
}

// TestLayoutOpcodeMaps walks every opcode of the legacy maps, with and
// without the usual prefixes, in each ModRM form.
func TestLayoutOpcodeMaps(t *testing.T) {
	var escapes [][]byte
	for op := range 256 {
		switch {
		case isLegacyPrefix(byte(op)), op&0xf0 == 0x40, op == 0x0f, op == 0xc4, op == 0xc5, op == 0x62:
			continue
		}
		escapes = append(escapes, []byte{byte(op)})
	}
	for op := range 256 {
		if op == 0x38 || op == 0x3a || op == 0x0f {
			continue
		}
		escapes = append(escapes, []byte{0x0f, byte(op)})
		escapes = append(escapes, []byte{0x0f, 0x38, byte(op)}, []byte{0x0f, 0x3a, byte(op)})
	}
	n := 0
	for _, pfx := range [][]byte{nil, {0x66}, {0xf2}, {0xf3}, {0x48}, {0x65, 0x48}, {0xf0}} {
		for _, op := range escapes {
			for _, m := range modrmForms {
				layoutAgrees(t, cat(pfx, op, m, filler))
				n++
			}
		}
	}
	t.Logf("%d encodings", n)
}

// TestLayoutVEX walks VEX and EVEX encodings: every opcode of each map,
// with the W, L and pp variants that select different instructions.
func TestLayoutVEX(t *testing.T) {
	n := 0
	for op := range 256 {
		for _, m := range modrmForms {
			for _, p1 := range []byte{0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff, 0x78, 0x79} {
				layoutAgrees(t, cat([]byte{0xc5, p1, byte(op)}, m, filler))
				n++
			}
			for _, p1 := range []byte{0xe1, 0xe2, 0xe3, 0x61, 0xc2} {
				for _, p2 := range []byte{0x79, 0x7d, 0xf9, 0xfd, 0x78, 0x7c, 0x7a, 0x7b, 0x7e, 0x7f, 0x01, 0x45} {
					layoutAgrees(t, cat([]byte{0xc4, p1, p2, byte(op)}, m, filler))
					n++
				}
			}
			for _, p0 := range []byte{0xf1, 0xf2, 0xf3} {
				for _, p1 := range []byte{0x7c, 0x7d, 0xfd, 0xfe, 0x7e, 0xff} {
					layoutAgrees(t, cat([]byte{0x62, p0, p1, 0x48, byte(op)}, m, filler))
					n++
				}
			}
		}
	}
	t.Logf("%d encodings", n)
}

func TestLayoutFields(t *testing.T) {
	for _, tc := range []struct {
		enc           []byte
		opcode, modrm int
		rip, prefixes int
		addr32, vex   bool
	}{
		{enc: []byte{0x48, 0x8b, 0x05, 0, 0, 0, 0}, opcode: 1, modrm: 2, rip: 3, prefixes: 1},
		{enc: []byte{0x83, 0x3d, 0, 0, 0, 0, 0}, opcode: 0, modrm: 1, rip: 2},
		{enc: []byte{0x65, 0x48, 0x8b, 0x04, 0x25, 0, 0, 0, 0}, opcode: 2, modrm: 3, rip: -1, prefixes: 2},
		{enc: []byte{0xf0, 0x48, 0x0f, 0xb1, 0x15, 0, 0, 0, 0}, opcode: 3, modrm: 4, rip: 5, prefixes: 2},
		{enc: []byte{0x66, 0x0f, 0x3a, 0x0f, 0x05, 0, 0, 0, 0, 8}, opcode: 3, modrm: 4, rip: 5, prefixes: 1},
		{enc: []byte{0xc5, 0xfd, 0x6f, 0x05, 0, 0, 0, 0}, opcode: 2, modrm: 3, rip: 4, vex: true},
		{enc: []byte{0xc4, 0xe2, 0x7d, 0x58, 0x0d, 0, 0, 0, 0}, opcode: 3, modrm: 4, rip: 5, vex: true},
		{enc: []byte{0x62, 0xf1, 0xfe, 0x48, 0x6f, 0x05, 0, 0, 0, 0}, opcode: 4, modrm: 5, rip: 6, vex: true},
		{enc: []byte{0xc5, 0xf8, 0x77}, opcode: 2, modrm: -1, rip: -1, vex: true},
		{enc: []byte{0x67, 0x8b, 0x05, 0, 0, 0, 0}, opcode: 1, modrm: 2, rip: 3, prefixes: 1, addr32: true},
		{enc: []byte{0x0f, 0x20, 0xc5}, opcode: 1, modrm: 2, rip: -1},
		{enc: []byte{0x0f, 0x22, 0x05}, opcode: 1, modrm: 2, rip: -1}, // mod is ignored
		{enc: []byte{0xe8, 0, 0, 0, 0}, opcode: 0, modrm: -1, rip: -1},
		{enc: []byte{0x8f, 0x05, 0, 0, 0, 0}, opcode: 0, modrm: 1, rip: 2},
	} {
		l, err := parseLayout(tc.enc)
		want := layout{prefixes: tc.prefixes, opcode: tc.opcode, modrm: tc.modrm, rip: tc.rip, addr32: tc.addr32, vex: tc.vex, opmap: l.opmap}
		if err != nil || l != want {
			t.Errorf("% x: %+v, %v; want %+v", tc.enc, l, err, want)
		}
	}
	for _, enc := range [][]byte{{}, {0x66}, {0x0f}, {0xc5, 0xfd}, {0x48, 0x8b, 0x05, 0, 0}, {0x8f, 0xe8, 0x78, 0xc2}, {0x0f, 0x0f, 0xc1, 0x0d}} {
		if l, err := parseLayout(enc); err == nil {
			t.Errorf("% x: %+v, want an error", enc, l)
		}
	}
}
