package codegen

import "encoding/binary"

// The few encodings the package emits itself.
const (
	opPushfq   = 0x9c
	opPopfq    = 0x9d
	opJmpRel32 = 0xe9
	opJmpRel8  = 0xeb
	opPushImm  = 0x68 // push imm32, sign-extended to 64 bits
	lenJmp32   = 5
	lenJcc32   = 6
	lenPush32  = 5
)

// movlHighToStack is "movl $imm32, 4(%rsp)" without its immediate: the
// high half of a pushed 64-bit return address.
var movlHighToStack = []byte{0xc7, 0x44, 0x24, 0x04}

// rel32 is the displacement from end (the address after the instruction
// or field that holds it) to target, if it fits a signed 32 bits.
func rel32(end, target uint64) (int32, error) {
	d := int64(target - end)
	if d != int64(int32(d)) {
		return 0, &ReachError{From: end, To: target}
	}
	return int32(d), nil
}

func appendLE32(b []byte, v int32) []byte {
	return binary.LittleEndian.AppendUint32(b, uint32(v))
}

// JmpRel32 encodes "jmp rel32" at from, jumping to to: the five bytes a
// direct splice writes over the original instruction.
func JmpRel32(from, to uint64) ([]byte, error) {
	return appendJmp(nil, from, to)
}

// appendJmp appends to b a jmp rel32 whose first byte is at address at.
func appendJmp(b []byte, at, to uint64) ([]byte, error) {
	d, err := rel32(at+lenJmp32, to)
	if err != nil {
		return nil, err
	}
	return appendLE32(append(b, opJmpRel32), d), nil
}

// appendJcc appends to b a jcc rel32 with condition cc (the low nibble of
// the opcode) whose first byte is at address at.
func appendJcc(b []byte, cc byte, at, to uint64) ([]byte, error) {
	d, err := rel32(at+lenJcc32, to)
	if err != nil {
		return nil, err
	}
	return appendLE32(append(b, 0x0f, 0x80|cc&0xf), d), nil
}

// appendPushRet appends a push of the return address of the call being
// relocated, so the callee returns into the original code: stacks unwind
// through real text, and the patch can be freed while a callee sleeps.
// An address that sign-extends from 32 bits (kernel text and modules,
// the top 2 GiB) is one "push imm32"; another (a user process's text)
// is that push of its low half, then "movl $high, 4(%rsp)": no register
// and no flag changes, and %rsp ends where the call leaves it.
func (in *insn) appendPushRet(b []byte) ([]byte, error) {
	ret := in.next()
	b = appendLE32(append(b, opPushImm), int32(uint32(ret)))
	if int64(ret) == int64(int32(ret)) {
		return b, nil
	}
	return appendLE32(append(b, movlHighToStack...), int32(uint32(ret>>32))), nil
}
