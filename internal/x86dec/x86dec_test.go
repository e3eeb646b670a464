package x86dec

import (
	"testing"

	"golang.org/x/arch/x86/x86asm"
)

func TestDecode(t *testing.T) {
	for _, tc := range []struct {
		code []byte
		op   x86asm.Op
		n    int
	}{
		{[]byte{0xc5, 0xf8, 0x77, 0x5b, 0x41, 0x5c}, x86asm.VZEROUPPER, 3}, // vzeroupper; pop %rbx…
		{[]byte{0xc5, 0xfc, 0x77, 0xc3}, x86asm.VZEROALL, 3},
		{[]byte{0xc4, 0xe1, 0x78, 0x77, 0xc3, 0xc3}, x86asm.VZEROUPPER, 4},
		{[]byte{0xc5, 0xf8, 0x77}, x86asm.VZEROUPPER, 3},
		{[]byte{0x48, 0x89, 0xe5, 0xc3}, x86asm.MOV, 3},
	} {
		in, err := Decode(tc.code)
		if err != nil || in.Op != tc.op || in.Len != tc.n {
			t.Errorf("% x: %v len %d, %v; want %v len %d", tc.code, in.Op, in.Len, err, tc.op, tc.n)
		}
	}
	// vvvv not 1111: #UD on the CPU, not a vzeroupper to shorten.
	if VzeroLen([]byte{0xc5, 0x30, 0x77, 0xc3}) != 0 {
		t.Error("c5 30 77 taken for vzeroupper")
	}
}
