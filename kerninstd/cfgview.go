package kerninstd

import (
	"encoding/hex"
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
)

// FunctionCFG analyses one function of the live kernel. It changes
// nothing.
func (d *Daemon) FunctionCFG(name string) (api.CFG, error) {
	p, err := cfg.ParsePoint(name)
	if err != nil || p.HasOffset || p.HasBlock {
		return api.CFG{}, badRequest(fmt.Errorf("cfg: want a function name, got %q", name))
	}
	syms, sym, _, err := d.lookup(p.Function)
	if err != nil {
		return api.CFG{}, err
	}
	fn, err := cfg.ReadFunction(d.text(), syms, sym)
	if err != nil {
		return api.CFG{}, err
	}
	names := syms.Names()
	out := api.CFG{Function: fn.Name, Module: fn.Module, Address: api.Addr(fn.Addr), Size: fn.End - fn.Addr, Truncated: fn.Truncated}
	blocks := fn.BlocksOpt(cfg.BlockOptions{Names: names, NoReturn: d.noReturn(), Tables: d.text()})
	protos := d.prototypes()
	lv := fn.LiveWith(blocks, names, protos, d.calleeReads())
	for _, b := range blocks {
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
			ci := d.describeInstruction(syms, fn, blocks, i)
			if ci.LiveIn = lv.Before(b.Index, i).Names(); ci.LiveIn == nil {
				ci.LiveIn = []string{}
			}
			cb.Instructions = append(cb.Instructions, ci)
		}
		out.Blocks = append(out.Blocks, cb)
	}
	return out, nil
}

// unrelocatable says why the patch cannot reproduce in, or "" if it can:
// such an instruction is refused too. (The address given only has to be
// in rel32 reach.)
func unrelocatable(in *cfg.Instruction) string {
	if _, err := codegen.Relocate(in.Addr, codegen.Site{Addr: in.Addr, Bytes: in.Bytes}); err != nil {
		return err.Error()
	}
	return ""
}

func (d *Daemon) describeInstruction(syms *kernel.Symbols, fn *cfg.Function, blocks []cfg.Block, i int) api.CFGInstruction {
	in := &fn.Insns[i]
	ci := api.CFGInstruction{
		Address: api.Addr(in.Addr), Offset: in.Addr - fn.Addr, Length: in.Len(),
		Bytes: hex.EncodeToString(in.Bytes), Text: in.String(),
	}
	if t, ok := cfg.BranchTarget(in); ok && (t < fn.Addr || t >= fn.End) {
		if s, off, ok := syms.At(t); ok {
			ci.Target = fmt.Sprintf("%s+%#x", s.Name, off)
		}
	}
	why := d.noSpliceReason(syms, fn, in.Addr)
	if why == "" && inPadding(blocks, i) {
		why = paddingReason
	}
	if why == "" {
		why = unrelocatable(in)
	}
	if why != "" {
		ci.SpliceClass, ci.Refused = "refused", why
	} else {
		// What a request would get now: a short instruction with no free
		// slot in reach is a trap splice.
		ci.SpliceClass = d.spliceClass(syms, fn, blocks, i).String()
	}
	return ci
}
