package kerninstd

import (
	"encoding/hex"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/splice"
)

// resolve maps a point to one instruction of the live kernel and plans
// its splice (splice.Planner.Resolve). It changes nothing.
func (d *Daemon) resolve(spec string) (*splice.Site, error) { return d.plan.Resolve(spec) }

// resolved describes a planned site for the API.
func resolved(s *splice.Site) api.Resolved {
	in := s.Insn()
	return api.Resolved{
		Point:       s.Point.Spec,
		Function:    s.Fn.Name,
		Module:      s.Fn.Module,
		Offset:      in.Addr - s.Fn.Addr,
		Address:     api.Addr(in.Addr),
		Length:      in.Len(),
		Bytes:       hex.EncodeToString(in.Bytes),
		Instruction: in.String(),
		SpliceClass: s.Class.String(),
		FlagsLive:   s.FlagsLive(),
		Classic:     (*api.ClassicName)(s.Point.Classic),
		Ambiguous:   int(s.Ambiguous),
	}
}
