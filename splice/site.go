package splice

import (
	"errors"
	"fmt"
	"slices"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

// Site is a planned splice: one instruction of a decoded function, how a
// splice there reaches its patch, and what the patch must preserve. A
// Site does not change once planned.
type Site struct {
	Point     Point // the point it was resolved from
	Sym       kernel.Symbol
	Fn        *cfg.Function
	Index     int // of the instruction in Fn.Insns
	Ambiguous int // other symbols of the function's name
	// Live: registers and flags that may be live before the instruction
	// (Func.Live).
	Live cfg.LiveSet
	// Class is how the splice reaches the patch, as planned.
	Class springboard.Class
	// Cover: for a covering splice, the instructions after this one that
	// its jmp overwrites, in order, each planned on its own (the patch runs
	// them all).
	Cover []*Site
}

// Detached returns a copy of s that keeps, of its function, only the
// instructions it splices (its own and those a covering splice runs
// over) with their bytes, not the whole decoded function: a coverage
// session holds a site for every block of the kernel, and a whole
// function's decoded instructions are about 200 bytes each. Index and
// the covered sites' indices then count in the copy. The engine needs no
// more of the function than this.
func (s *Site) Detached() *Site {
	n := 1 + len(s.Cover)
	fn := &cfg.Function{Name: s.Fn.Name, Module: s.Fn.Module, Addr: s.Fn.Addr, End: s.Fn.End, Truncated: s.Fn.Truncated,
		Insns: make([]cfg.Instruction, n)}
	for i := range n {
		in := s.Fn.Insns[s.Index+i]
		in.Bytes = slices.Clone(in.Bytes)
		fn.Insns[i] = in
	}
	d := *s
	d.Fn, d.Index, d.Cover = fn, 0, nil
	for i, c := range s.Cover {
		cc := *c
		cc.Fn, cc.Index, cc.Cover = fn, i+1, nil
		d.Cover = append(d.Cover, &cc)
	}
	return &d
}

// Insn is the instruction.
func (s *Site) Insn() *cfg.Instruction { return &s.Fn.Insns[s.Index] }

// Addr is the instruction's address.
func (s *Site) Addr() uint64 { return s.Fn.Insns[s.Index].Addr }

// FlagsLive: a patch here must preserve RFLAGS.
func (s *Site) FlagsLive() bool { return s.Live.Flags() != 0 }

// Where is the instruction as FUNC+0xOFF.
func (s *Site) Where() string {
	return fmt.Sprintf("%s+%#x", s.Fn.Name, s.Insn().Addr-s.Fn.Addr)
}

// ErrBadPoint is matched by errors for a point spec that does not parse
// or names no block of its function: the caller's mistake.
var ErrBadPoint = errors.New("bad point")

// BadPointError is a point spec the planner cannot use (ErrBadPoint).
type BadPointError struct{ Err error }

func (e *BadPointError) Error() string        { return e.Err.Error() }
func (e *BadPointError) Unwrap() error        { return e.Err }
func (e *BadPointError) Is(target error) bool { return target == ErrBadPoint }
