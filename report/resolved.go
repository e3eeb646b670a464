package report

import (
	"encoding/hex"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/splice"
)

// Resolved describes a planned site for the API: kerninstd's answer to a
// resolve, a session's probes, a bench's point.
func Resolved(s *splice.Site) api.Resolved {
	in := s.Insn()
	r := api.Resolved{
		Function:    s.Fn.Name,
		Module:      s.Fn.Module,
		Offset:      in.Addr - s.Fn.Addr,
		Address:     api.Addr(in.Addr),
		Length:      in.Len(),
		Bytes:       hex.EncodeToString(in.Bytes),
		Instruction: in.String(),
		SpliceClass: s.Class.String(),
		FlagsLive:   s.FlagsLive(),
		Ambiguous:   s.Ambiguous(),
	}
	if s.Point() != nil {
		r.Point, r.Classic = s.Point().Spec, (*api.ClassicName)(s.Point().Classic)
	}
	return r
}
