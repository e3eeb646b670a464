package codegen

import (
	"encoding/binary"
	"errors"
)

// layout is where the parts of an x86-64 encoding sit, found by walking
// prefixes, opcode map and ModRM ourselves rather than trusting one
// decoder: x86asm's VEX decoder reports "disp32(%rip)" as an absolute
// "disp32", and an instruction copied with such an operand would silently
// address the wrong byte from the patch.
type layout struct {
	prefixes int  // number of legacy and REX prefix bytes before the opcode or VEX/EVEX
	opcode   int  // offset of the opcode byte (the last one for 0f/0f38/0f3a)
	opmap    int  // opcode map: 0 one-byte, 1 0f, 2 0f38, 3 0f3a (VEX: its map)
	modrm    int  // offset of the ModRM byte, or -1
	rip      int  // offset of a RIP-relative disp32, or -1
	addr32   bool // 67 prefix: a RIP-relative operand is EIP-relative
	vex      bool // VEX- or EVEX-encoded
}

var (
	errTruncated = errors.New("encoding ends inside the instruction")
	errEncoding  = errors.New("unsupported encoding")
	errInvalid   = errors.New("invalid or truncated encoding")
)

// Which opcodes of the one-byte and 0f maps take a ModRM byte in 64-bit
// mode: row is the high nibble, column the low one. Prefixes and escapes
// (0f, VEX c4/c5, EVEX 62, XOP 8f) are dealt with before these are read;
// opcodes invalid in 64-bit mode are 0 (x86asm refuses them anyway).
var (
	oneByteModRM = opcodeTable([16]string{
		//    0123456789abcdef
		0x0: "1111000011110000", // add, or
		0x1: "1111000011110000", // adc, sbb
		0x2: "1111000011110000", // and, sub
		0x3: "1111000011110000", // xor, cmp
		0x4: "0000000000000000", // REX
		0x5: "0000000000000000", // push, pop
		0x6: "0001000001010000", // movsxd, imul
		0x7: "0000000000000000", // jcc rel8
		0x8: "1111111111111111", // group 1, test, xchg, mov, lea, pop r/m
		0x9: "0000000000000000",
		0xa: "0000000000000000",
		0xb: "0000000000000000",
		0xc: "1100001100000000", // shift imm8, mov r/m,imm
		0xd: "1111000011111111", // shift 1/cl, x87
		0xe: "0000000000000000", // loop, jrcxz, in/out, call, jmp
		0xf: "0000001100000011", // groups 3, 4, 5
	})
	twoByteModRM = opcodeTable([16]string{
		//    0123456789abcdef
		0x0: "1111000000000101", // groups 6, 7, lar, lsl, prefetch, 3DNow!
		0x1: "1111111111111111", // SSE moves, hint nops, endbr
		0x2: "1111000011111111", // mov cr/dr (register-only), SSE
		0x3: "0000000000000000", // wrmsr, rdtsc, ..., escapes 38 and 3a
		0x4: "1111111111111111", // cmovcc
		0x5: "1111111111111111",
		0x6: "1111111111111111",
		0x7: "1111111011001111", // not emms
		0x8: "0000000000000000", // jcc rel32
		0x9: "1111111111111111", // setcc
		0xa: "0001110000011111", // bt, shld, bts, shrd, group 15, imul
		0xb: "1111111111111111", // cmpxchg, ..., popcnt, ud1, group 8, bsf, movsx
		0xc: "1111111100000000", // xadd, SSE, group 9; not bswap
		0xd: "1111111111111111",
		0xe: "1111111111111111",
		0xf: "1111111111111111", // ..., ud0
	})
)

func opcodeTable(rows [16]string) (t [256]bool) {
	for hi, row := range rows {
		if len(row) != 16 {
			panic("codegen: opcode table rows need 16 entries")
		}
		for lo, c := range row {
			t[hi<<4|lo] = c == '1'
		}
	}
	return t
}

// isLegacyPrefix reports the legacy prefixes: lock, rep/repne, segment
// overrides (and branch hints), operand and address size.
func isLegacyPrefix(c byte) bool {
	switch c {
	case 0xf0, 0xf2, 0xf3, 0x2e, 0x36, 0x3e, 0x26, 0x64, 0x65, 0x66, 0x67:
		return true
	}
	return false
}

// parseLayout finds the opcode, ModRM and any RIP-relative displacement of
// the single instruction b in 64-bit mode. It does not work out the
// length; the caller has x86asm for that and cross-checks the two.
func parseLayout(b []byte) (layout, error) {
	l := layout{modrm: -1, rip: -1}
	i := 0
	for i < len(b) && (isLegacyPrefix(b[i]) || b[i]&0xf0 == 0x40) {
		if b[i] == 0x67 {
			l.addr32 = true
		}
		i++
	}
	l.prefixes = i
	if i >= len(b) {
		return l, errTruncated
	}
	need := func(n int) error {
		if i+n > len(b) {
			return errTruncated
		}
		return nil
	}
	switch c := b[i]; {
	case c == 0xc5: // two-byte VEX: map 0f
		if err := need(3); err != nil {
			return l, err
		}
		l.vex, l.opcode, l.opmap = true, i+2, 1
		if b[l.opcode] != 0x77 { // vzeroupper/vzeroall have no ModRM
			l.modrm = i + 3
		}
	case c == 0xc4: // three-byte VEX
		if err := need(4); err != nil {
			return l, err
		}
		m := b[i+1] & 0x1f
		if m < 1 || m > 3 {
			return l, errEncoding
		}
		l.vex, l.opcode, l.opmap = true, i+3, int(m)
		if !(m == 1 && b[l.opcode] == 0x77) {
			l.modrm = i + 4
		}
	case c == 0x62: // EVEX: every instruction has a ModRM
		if err := need(5); err != nil {
			return l, err
		}
		l.vex, l.opcode, l.modrm, l.opmap = true, i+4, i+5, int(b[i+1]&7)
	case c == 0x8f && i+1 < len(b) && b[i+1]&0x1f >= 8: // AMD XOP
		return l, errEncoding
	case c == 0x0f:
		if err := need(2); err != nil {
			return l, err
		}
		switch b[i+1] {
		case 0x38, 0x3a: // three-byte maps: all have a ModRM
			l.opcode, l.modrm, l.opmap = i+2, i+3, 2
			if b[i+1] == 0x3a {
				l.opmap = 3
			}
		case 0x0f: // 3DNow!
			return l, errEncoding
		default:
			l.opcode, l.opmap = i+1, 1
			if twoByteModRM[b[i+1]] {
				l.modrm = i + 2
			}
		}
	default:
		l.opcode = i
		if oneByteModRM[c] {
			l.modrm = i + 1
		}
	}
	if l.modrm < 0 {
		return l, nil
	}
	if l.modrm >= len(b) {
		return l, errTruncated
	}
	// mod=00 rm=101 is RIP-relative in 64-bit mode, whatever REX.B says,
	// except for mov to/from control and debug registers, which ignore mod.
	m := b[l.modrm]
	regOnly := !l.vex && l.opmap == 1 && b[l.opcode] >= 0x20 && b[l.opcode] <= 0x23
	if m>>6 == 0 && m&7 == 5 && !regOnly {
		if l.modrm+5 > len(b) {
			return l, errTruncated
		}
		l.rip = l.modrm + 1
	}
	return l, nil
}

// le32 reads the signed 32-bit little-endian value at b[off:].
func le32(b []byte, off int) int32 { return int32(binary.LittleEndian.Uint32(b[off:])) }
