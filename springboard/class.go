// Package springboard decides how a splice reaches its patch from an
// instruction of a given length, and owns the springboard heap:
// never-executed bytes within rel8 reach of short instructions, handed
// out as 5-byte slots that hold a jmp rel32 to a patch (KernInst's
// springboards).
package springboard

import (
	"errors"
	"fmt"
)

// Class is how a splice of one instruction reaches its patch.
type Class uint8

const (
	// Direct: the instruction is at least 5 bytes, room for jmp rel32.
	Direct Class = iota
	// Springboard: 2–4 bytes, room for a jmp rel8 to a springboard slot.
	Springboard
	// Trap: 1 byte, or short with no slot in reach: a permanent int3.
	Trap
	// Cover: short, but the jmp rel32 of a direct splice fits over it and
	// the next whole instructions of its basic block, which the patch runs
	// too (nothing may jump between them). Chosen by the daemon, which
	// knows the control flow; Classify never returns it.
	Cover
	// Pun: in a process, where a trap splice was asked for, a jmp rel32
	// written over the instruction whose last bytes are the following
	// instructions' own, to a trampoline at the address they give
	// (E9Patch's instruction punning). The process device makes it; the
	// planner never returns it.
	Pun
)

// JmpRel32Len is the length of the jmp rel32 a direct splice writes.
const JmpRel32Len = 5

func (c Class) String() string {
	switch c {
	case Direct:
		return "direct"
	case Springboard:
		return "springboard"
	case Trap:
		return "trap"
	case Cover:
		return "covering"
	case Pun:
		return "punned"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// Classify returns the splice class of an instruction of length n.
func Classify(n int) Class {
	switch {
	case n >= JmpRel32Len:
		return Direct
	case n >= 2:
		return Springboard
	default:
		return Trap
	}
}

// ErrTooShort is matched by TooShortError.
var ErrTooShort = errors.New("instruction too short for a direct splice")

// TooShortError refuses a splice at an instruction shorter than a jmp rel32
// while springboard and trap splices are not available.
type TooShortError struct {
	Addr  uint64
	Len   int
	Where string // symbolic location, e.g. "filename_lookup+0x3"
	Text  string // the instruction
}

func (e *TooShortError) Error() string {
	return fmt.Sprintf("%s (%s) is %d byte(s): too short for a direct splice (needs %d); it would need a %s splice, which kinst does not make yet",
		e.Where, e.Text, e.Len, JmpRel32Len, Classify(e.Len))
}

func (e *TooShortError) Is(target error) bool { return target == ErrTooShort }
