package engine

import (
	"errors"
	"fmt"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/splice"
)

// allocPatch allocates n bytes of patch heap, reclaiming retired patches
// first if the heap is full. With freePatch, the only use of the device's
// patch heap. The caller holds e.mu.
func (e *Engine) allocPatch(n int) (uint64, error) {
	p, err := e.dev.PatchAlloc(n)
	if err != nil && len(e.retired) > 0 {
		e.reclaimLocked()
		p, err = e.dev.PatchAlloc(n)
	}
	return p, err
}

// freePatch frees a patch no splice leads to. The device waits for an
// RCU-tasks grace period first if a splice was removed or re-pointed
// since its last wait, so no task can still be running in it. The caller
// holds e.mu.
func (e *Engine) freePatch(p uint64) error { return e.dev.PatchFree(p) }

// patchSpecs is the point's patch for reqs: one part per instruction the
// splice overwrites, each with the snippets of the requests at it, all but
// the last falling through to the next part.
func (pt *point) patchSpecs(reqs []*Request) []codegen.PatchSpec {
	sites := pt.sites()
	specs := make([]codegen.PatchSpec, len(sites))
	for k, ps := range sites {
		var at []*Request
		for _, r := range reqs {
			if r.Site().Addr() == ps.Addr() {
				at = append(at, r)
			}
		}
		specs[k] = patchSpec(ps, at)
		specs[k].FallThrough = k < len(sites)-1
		specs[k].RedZone = pt.redZone
	}
	return specs
}

// buildPatch generates and verifies the point's patch at addr: the parts
// of specs end to end, each checked against the registers live at its own
// instruction.
func (pt *point) buildPatch(addr uint64, specs []codegen.PatchSpec) ([]byte, error) {
	var code []byte
	for k, ps := range pt.sites() {
		part, err := buildPatch(addr+uint64(len(code)), ps, specs[k])
		if err != nil {
			return nil, err
		}
		code = append(code, part...)
	}
	return code, nil
}

// patchSpec is the patch for reqs at s.
func patchSpec(s *splice.Site, reqs []*Request) codegen.PatchSpec {
	spec := codegen.PatchSpec{
		Site: codegen.Site{Addr: s.Addr(), Bytes: s.Bytes()},
		Live: codegen.Live{Regs: uint16(s.Live), Flags: s.FlagsLive()},
	}
	for _, r := range reqs {
		spec.Snippets = append(spec.Snippets, r.snippet)
	}
	return spec
}

// buildPatch generates the patch at addr and checks it three ways: decoded
// back (codegen.VerifyPatch), and the instrumentation decoded by the
// liveness code, which must find nothing live overwritten.
func buildPatch(addr uint64, s *splice.Site, spec codegen.PatchSpec) ([]byte, error) {
	p, err := codegen.BuildPatch(addr, spec)
	if err != nil {
		return nil, err
	}
	if err := codegen.VerifyPatch(p, spec); err != nil {
		return nil, err
	}
	if p.Instr > 0 { // a covering patch's part may have no snippets
		// The red zone skip moves %rsp and back; what it brackets must
		// leave everything live as it was.
		in, off, err := codegen.InsideRedZone(p.Code[:p.Instr], spec.RedZone)
		if err != nil {
			return nil, err
		}
		if err := checkClobbers(in, addr+uint64(off), s.Live); err != nil {
			return nil, err
		}
	}
	return p.Code, nil
}

// ErrClobber is matched by errors from checkClobbers.
var ErrClobber = errors.New("patch would clobber live state")

// checkClobbers decodes a patch's instrumentation back and refuses it if
// it overwrites, without restoring, a register or flag live at the site:
// the last line of defence against a code generator bug.
func checkClobbers(prefix []byte, addr uint64, live cfg.LiveSet) error {
	c, err := cfg.Clobbers(prefix, addr)
	if err != nil {
		return err
	}
	if bad := c & live; bad != 0 {
		return fmt.Errorf("%w: %v (a code generator bug; nothing was spliced)", ErrClobber, bad)
	}
	return nil
}
