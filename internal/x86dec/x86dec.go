// Package x86dec is x86asm's 64-bit decoder with the corrections kinst
// needs: x86asm (golang.org/x/arch v0.32) takes the byte after VEX
// vzeroupper or vzeroall for a ModRM they do not have, so it makes them
// two bytes too long whenever more bytes follow (as they always do in a
// function), and every instruction boundary after one comes out wrong.
package x86dec

import "golang.org/x/arch/x86/x86asm"

// Decode decodes the instruction at the start of b in 64-bit mode.
func Decode(b []byte) (x86asm.Inst, error) {
	inst, err := x86asm.Decode(b, 64)
	if err == nil && (inst.Op == x86asm.VZEROUPPER || inst.Op == x86asm.VZEROALL) {
		if n := VzeroLen(b); n > 0 {
			inst.Len = n
		}
	}
	return inst, err
}

// VzeroLen is the length of the VEX vzeroupper or vzeroall at the start
// of b (c5 f8/fc 77, or c4 e1 78/7c 77), 0 if there is none. Other VEX
// fields than L must be as the instruction requires (vvvv 1111, map 0f,
// no pp), or the CPU raises #UD: those are not these instructions.
func VzeroLen(b []byte) int {
	switch {
	case len(b) >= 3 && b[0] == 0xc5 && (b[1] == 0xf8 || b[1] == 0xfc) && b[2] == 0x77:
		return 3
	case len(b) >= 4 && b[0] == 0xc4 && b[1] == 0xe1 && (b[2]&0x7f == 0x78 || b[2]&0x7f == 0x7c) && b[3] == 0x77:
		return 4
	}
	return 0
}
