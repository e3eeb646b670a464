package codegen

import (
	"encoding/binary"
)

// Encodings the package emits.
const (
	opPushfq   = 0x9c
	opPopfq    = 0x9d
	opJmpRel32 = 0xe9
	opJmpRel8  = 0xeb
	opPushImm  = 0x68
	lenJmp32   = 5
	lenPush32  = 5
)

// rel32 is the displacement from end (the address after the instruction)
// to target.
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

// JmpRel32 encodes "jmp rel32" at from, jumping to to: the bytes a direct
// splice writes.
func JmpRel32(from, to uint64) ([]byte, error) {
	return appendJmp(nil, from, to)
}

// appendJmp appends a jmp rel32 placed at at (the address of its first
// byte) to b.
func appendJmp(b []byte, at, to uint64) ([]byte, error) {
	d, err := rel32(at+lenJmp32, to)
	if err != nil {
		return nil, err
	}
	return appendLE32(append(b, opJmpRel32), d), nil
}

// appendPushImm32 appends "push imm32" of v, which must sign-extend to
// itself (true of kernel text addresses, in the top 2 GiB).
func appendPushImm32(b []byte, v uint64, addr uint64, text string) ([]byte, error) {
	if int64(v) != int64(int32(v)) {
		return nil, &UnsupportedError{Addr: addr, Inst: text, Reason: "return address does not fit a sign-extended imm32"}
	}
	return appendLE32(append(b, opPushImm), int32(v)), nil
}
