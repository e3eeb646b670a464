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

// appendPushRet appends "push imm32" of the return address of the call
// being relocated, so the callee returns into the original code: stacks
// unwind through real kernel text, and the patch can be freed while a
// callee sleeps. The address must sign-extend from 32 bits, which kernel
// text and modules (the top 2 GiB) do.
func (in *insn) appendPushRet(b []byte) ([]byte, error) {
	ret := in.next()
	if int64(ret) != int64(int32(ret)) {
		return nil, in.refuse("return address %#x does not fit a sign-extended imm32 (not in the top 2 GiB)", ret)
	}
	return appendLE32(append(b, opPushImm), int32(ret)), nil
}
