// Package report turns what the domain packages compute into the api
// package's report types: the one boundary where a splice.Func or a
// cover.Set becomes what kerninstd answers and kinst --json prints, so
// that the packages below the api floor never import it.
package report

import (
	"encoding/hex"
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/splice"
)

// CFG is f's control-flow graph as `kinst cfg` reports it: blocks,
// edges, and each instruction with what is live before it and the splice
// a request there would get now.
func CFG(f *splice.Func) api.CFG {
	fn := f.Fn
	out := api.CFG{Function: fn.Name, Module: fn.Module, Address: api.Addr(fn.Addr), Size: fn.End - fn.Addr, Truncated: fn.Truncated}
	lv := f.Liveness()
	for _, b := range f.Blocks {
		cb := api.CFGBlock{Index: b.Index, Start: api.Addr(b.Start(fn)), Padding: b.Padding, Preds: b.Preds, Succs: []api.CFGEdge{}}
		if b.Exit != cfg.NoExit {
			cb.Exit = b.Exit.String()
		}
		if cb.Preds == nil {
			cb.Preds = []int{}
		}
		for _, e := range b.Succs {
			cb.Succs = append(cb.Succs, api.CFGEdge{Kind: e.Kind.String(), To: e.To})
		}
		for i := b.First; i < b.First+b.N; i++ {
			ci := describeInstruction(f, i)
			if ci.LiveIn = lv.Before(b.Index, i).Names(); ci.LiveIn == nil {
				ci.LiveIn = []string{}
			}
			cb.Instructions = append(cb.Instructions, ci)
		}
		out.Blocks = append(out.Blocks, cb)
	}
	return out
}

// describeInstruction is instruction i of f with what a request there
// would get now: refused with the reason, or the splice class (a short
// instruction with no free slot in reach is a covering or trap splice).
func describeInstruction(f *splice.Func, i int) api.CFGInstruction {
	fn := f.Fn
	in := &fn.Insns[i]
	ci := api.CFGInstruction{
		Address: api.Addr(in.Addr), Offset: in.Addr - fn.Addr, Length: in.Len(),
		Bytes: hex.EncodeToString(in.Bytes), Text: in.String(),
	}
	if t, ok := cfg.BranchTarget(in); ok && (t < fn.Addr || t >= fn.End) {
		if s, off, ok := f.Facts().Symbols.At(t); ok {
			ci.Target = fmt.Sprintf("%s+%#x", s.Name, off)
		}
	}
	if why := f.Refusal(i); why != "" {
		ci.SpliceClass, ci.Refused = "refused", why
	} else {
		ci.SpliceClass = f.Class(i).String()
	}
	return ci
}

// CFGLines fills the source line of each of g's instructions from dbg:
// the line of its address less slide (the module's load or KASLR slide),
// where dbg has one.
func CFGLines(g *api.CFG, dbg *debuginfo.File, slide uint64) {
	for i := range g.Blocks {
		for j := range g.Blocks[i].Instructions {
			in := &g.Blocks[i].Instructions[j]
			if l, err := dbg.LineAt(uint64(in.Address) - slide); err == nil && l.Line != 0 {
				in.Line = l.String()
			}
		}
	}
}
