#include "textflag.h"

// func cmpxchg16bFlags(mem *[4]uint64, probe uint64) uint64
TEXT ·cmpxchg16bFlags(SB), NOSPLIT, $16-24
	MOVQ	mem+0(FP), DI
	ADDQ	$15, DI
	ANDQ	$~15, DI
	MOVQ	probe+8(FP), SI
	XORQ	AX, AX
	XORQ	DX, DX
	XORQ	BX, BX
	XORQ	CX, CX
	XORQ	R9, R9
	// popfq ends the emulator's translation block; the next one begins
	// with its condition-code state holding the whole RFLAGS value.
	PUSHFQ
	POPFQ
	// The add's source operand is what a stale computation reads as flags.
	ADDQ	SI, R9
	CMPXCHG16B	(DI)
	PUSHFQ
	POPQ	AX
	MOVQ	AX, ret+16(FP)
	RET
