package codegen

import (
	"errors"
	"fmt"
)

var (
	// ErrOutOfReach: a rel32 or disp32 cannot span the distance.
	ErrOutOfReach = errors.New("out of rel32 reach")
	// ErrUnsupported: the instruction cannot be relocated.
	ErrUnsupported = errors.New("instruction cannot be relocated")
	// ErrVerify: a generated patch does not decode to what was intended.
	ErrVerify = errors.New("patch verification failed")
)

// ReachError is a displacement from From to To that does not fit 32 bits.
type ReachError struct{ From, To uint64 }

func (e *ReachError) Error() string {
	return fmt.Sprintf("%#x is out of rel32 reach of %#x", e.To, e.From)
}

func (e *ReachError) Is(t error) bool { return t == ErrOutOfReach }

// UnsupportedError refuses to relocate an instruction, with the reason.
type UnsupportedError struct {
	Addr   uint64
	Inst   string
	Reason string
}

func (e *UnsupportedError) Error() string {
	return fmt.Sprintf("cannot relocate %q at %#x: %s", e.Inst, e.Addr, e.Reason)
}

func (e *UnsupportedError) Is(t error) bool { return t == ErrUnsupported }

// VerifyError locates the first thing wrong in a patch.
type VerifyError struct {
	Offset int
	Reason string
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("patch +%#x: %s", e.Offset, e.Reason)
}

func (e *VerifyError) Is(t error) bool { return t == ErrVerify }
