package splice

import (
	"errors"
	"fmt"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/springboard"
)

// Site is a planned splice: one instruction of a decoded function, how a
// splice there reaches its patch, and what the patch must preserve. A
// Site does not change once planned.
//
// (Kept small: a coverage session holds one per probe. The function's
// symbol is Fn's name, module and address; Func.Sym has the rest.)
type Site struct {
	Fn *cfg.Function
	// x is what a site of a decoded function has beyond a detached one
	// (its point and index) and a covering site's run; nil for a
	// detached site that covers nothing and has an unambiguous name: a
	// coverage session's probes, which so take 48 bytes each.
	x *siteExtra
	// raw: a detached site's instruction (Detached; raw.n == 0 for a
	// site of a decoded function).
	raw rawInsn
	// Live: registers and flags that may be live before the instruction
	// (Func.Live).
	Live cfg.LiveSet
	// Class is how the splice reaches the patch, as planned.
	Class springboard.Class
}

// siteExtra is the part of a Site most probes do without.
type siteExtra struct {
	point     *Point
	index     int32 // of the instruction in Fn.Insns
	ambiguous int32 // other symbols of the function's name
	cover     []*Site
	pad       []byte // Padding
}

// Point is the point the site was resolved from; nil for a detached
// site (a coverage probe's, which needs none).
func (s *Site) Point() *Point {
	if s.x == nil {
		return nil
	}
	return s.x.point
}

// Index is the instruction's index in Fn.Insns; 0 for a detached site.
func (s *Site) Index() int {
	if s.x == nil {
		return 0
	}
	return int(s.x.index)
}

// Ambiguous is the number of other symbols of the function's name.
func (s *Site) Ambiguous() int {
	if s.x == nil {
		return 0
	}
	return int(s.x.ambiguous)
}

// Detached returns a copy of s that keeps no Point and, of its function,
// only the name and bounds, and of its instructions (its own and those a covering
// splice runs over) only their addresses and bytes: a coverage session
// holds a site for every block of the kernel, a whole function's decoded
// instructions are about 230 bytes each, and the engine reads no more than
// an instruction's address and bytes. Insn decodes the instruction again.
// fn, when not nil, is the function without its instructions
// (cfg.Function.Header), shared by the detached sites of one function;
// nil makes one.
func (s *Site) Detached(fn *cfg.Function) *Site {
	if fn == nil {
		fn = s.Fn.Header()
	}
	d := s.detach(fn)
	if cs := s.Covered(); len(cs) > 0 {
		dc := make([]*Site, len(cs))
		for i, c := range cs {
			dc[i] = c.detach(fn)
		}
		if d.x == nil {
			d.x = &siteExtra{}
		}
		d.x.cover = dc
	}
	if pad := s.Padding(); len(pad) > 0 {
		if d.x == nil {
			d.x = &siteExtra{}
		}
		d.x.pad = pad
	}
	return d
}

// detach is Detached without the covered sites.
func (s *Site) detach(fn *cfg.Function) *Site {
	d := &Site{Fn: fn, Live: s.Live, Class: s.Class}
	if n := s.Ambiguous(); n != 0 {
		d.x = &siteExtra{ambiguous: int32(n)}
	}
	d.raw.addr, d.raw.n = s.Addr(), uint8(copy(d.raw.bytes[:], s.Bytes()))
	return d
}

// Covered is, for a covering splice, the instructions after this one
// that its jmp overwrites, in order, each planned on its own (the patch
// runs them all). A springboard splice planned where traps are refused
// has them too: the covering splice the engine falls back on when its
// slot is gone at install. nil otherwise.
func (s *Site) Covered() []*Site {
	if s.x == nil {
		return nil
	}
	return s.x.cover
}

// Padding is the never-run nops right after the splice's last
// instruction, a ret or jmp -- the covered run's, or a lone one's own --
// that the splice may overwrite (Func.CoverRun; only in a process): a
// covering splice's jmp runs on over them (the patch runs the covered
// instructions only); a trap splice's punned jmp takes them as free
// rel32 bytes (TrapPadding). nil otherwise.
func (s *Site) Padding() []byte {
	if s.x == nil {
		return nil
	}
	return s.x.pad
}

// TrapPadding is what of Padding a trap splice at s may take as part of
// its instruction: the nops right after it, when it covers nothing else,
// up to 4 bytes in all (a pun's).
func (s *Site) TrapPadding() []byte {
	if len(s.Covered()) > 0 {
		return nil
	}
	pad := s.Padding()
	return pad[:max(0, min(len(pad), springboard.JmpRel32Len-1-len(s.Bytes())))]
}

// PlanTrap makes s a trap splice, whatever it was planned as.
func (s *Site) PlanTrap() {
	s.Class = springboard.Trap
	if s.x != nil {
		if len(s.x.cover) > 0 {
			s.x.pad = nil // it follows the run, not this instruction
		}
		s.x.cover = nil
	}
}

// rawInsn is a detached site's instruction: its address and bytes.
type rawInsn struct {
	addr  uint64
	n     uint8
	bytes [15]byte
}

// Insn is the instruction. A detached site's is decoded again from its
// bytes at each call: read it once where it is needed.
func (s *Site) Insn() *cfg.Instruction {
	if s.raw.n == 0 {
		return &s.Fn.Insns[s.x.index]
	}
	r := &s.raw
	in, err := cfg.DecodeAt(r.addr, r.bytes[:r.n:r.n])
	if err != nil {
		// The bytes were decoded when the site was planned.
		panic(fmt.Sprintf("splice: detached site %s+%#x no longer decodes: %v", s.Fn.Name, r.addr-s.Fn.Addr, err))
	}
	return &in
}

// Bytes is the instruction's bytes, without decoding a detached site's
// again: what the engine reads of it, at every patch and splice.
func (s *Site) Bytes() []byte {
	if s.raw.n != 0 {
		r := &s.raw
		return r.bytes[:r.n:r.n]
	}
	return s.Fn.Insns[s.x.index].Bytes
}

// Addr is the instruction's address.
func (s *Site) Addr() uint64 {
	if s.raw.n != 0 {
		return s.raw.addr
	}
	return s.Fn.Insns[s.x.index].Addr
}

// FlagsLive: a patch here must preserve RFLAGS.
func (s *Site) FlagsLive() bool { return s.Live.Flags() != 0 }

// Where is the instruction as FUNC+0xOFF.
func (s *Site) Where() string {
	return fmt.Sprintf("%s+%#x", s.Fn.Name, s.Addr()-s.Fn.Addr)
}

// PointError ties an error to the point spec that caused it: what
// kerninstd answers a request whose point failed to resolve or splice
// with (api.ErrorResponse.Point).
type PointError struct {
	Point string
	Err   error
}

func (e *PointError) Error() string { return fmt.Sprintf("%s: %v", e.Point, e.Err) }
func (e *PointError) Unwrap() error { return e.Err }

// ErrBadPoint is matched by errors for a point spec that does not parse
// or names no block of its function: the caller's mistake.
var ErrBadPoint = errors.New("bad point")

// BadPointError is a point spec the planner cannot use (ErrBadPoint).
type BadPointError struct{ Err error }

func (e *BadPointError) Error() string        { return e.Err.Error() }
func (e *BadPointError) Unwrap() error        { return e.Err }
func (e *BadPointError) Is(target error) bool { return target == ErrBadPoint }
