package cli

import (
	"context"
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/procsession"
)

// Lines lists the source lines of the kernel function fn, as perf probe
// -L does, with the splice class of the instruction each starts at (from
// kerninstd's plan of the function): the lines a FILE:LINE point can
// name. The lines come from the debug vmlinux (o).
func Lines(ctx context.Context, c *api.Client, fn string, o DebugOptions, asJSON bool, env Env) error {
	cfg, err := c.CFG(ctx, fn)
	if err != nil {
		return err
	}
	dbg, err := debugForFunction(ctx, c, cfg, o)
	if err != nil {
		return fmt.Errorf("lines: %w", err)
	}
	defer dbg.Close()
	link, err := linkAddr(dbg.Symbols(), cfg)
	if err != nil {
		return fmt.Errorf("%s: %w (in %s)", fn, err, dbg.Path)
	}
	return writeLines(cfg, dbg, link, asJSON, env)
}

// LinesProcess is Lines for a function of the user process pid (FUNC or
// LIB:FUNC; pid 0 starts command stopped at its entry point for it), from
// the executable's DWARF or the library's, or their debug files by build
// id, with the splice classes kinst's own plan of the process gives. Only
// the process's memory is read; nothing is written into it.
func LinesProcess(ctx context.Context, pid int, fn string, command []string, asJSON bool, env Env) error {
	t, err := processTarget(pid, command, env, procsession.Options{})
	if err != nil {
		return err
	}
	defer t.proc.abort()
	cfg, err := t.proc.host.CFG(ctx, fn)
	if err != nil {
		return err
	}
	dbg, link, err := t.proc.functionDebug(cfg)
	if err != nil {
		return fmt.Errorf("lines: %w", err)
	}
	defer dbg.Close()
	return writeLines(cfg, dbg, link, asJSON, env)
}

// writeLines writes the lines report of the function cfg describes, whose
// code is at link in dbg.
func writeLines(cfg api.CFG, dbg *debuginfo.File, link uint64, asJSON bool, env Env) error {
	fn := cfg.Function
	lines, at, err := dbg.FuncLines(link, link+cfg.Size)
	if err != nil {
		return fmt.Errorf("%s: %w (in %s)", fn, err, dbg.Path)
	}
	insn := map[uint64]api.CFGInstruction{}
	for _, b := range cfg.Blocks {
		for _, in := range b.Instructions {
			insn[in.Offset] = in
		}
	}
	rep := output.LinesReport{Function: cfg.Function, Address: cfg.Address, Vmlinux: dbg.Path}
	if decl, err := dbg.DeclLine(link); err == nil {
		rep.Declared = decl.String()
	}
	for i, l := range lines {
		off := at[i] - link
		sl := output.SourceLine{File: l.File, Line: l.Line, Offset: off, Point: fmt.Sprintf("%s+%#x", cfg.Function, off)}
		if in, ok := insn[off]; ok {
			sl.SpliceClass, sl.Refused = in.SpliceClass, in.Refused
		} else {
			sl.SpliceClass, sl.Refused = "refused", "not an instruction of the decoded function"
		}
		rep.Lines = append(rep.Lines, sl)
	}
	if asJSON {
		return writeJSON(env.Out, rep)
	}
	fmt.Fprintf(env.Out, "%s at %#x (lines from %s)\n", rep.Function, uint64(rep.Address), rep.Vmlinux)
	if rep.Declared != "" {
		fmt.Fprintf(env.Out, "declared at %s (FUNC:+N counts from there)\n", rep.Declared)
	}
	fmt.Fprintln(env.Out)
	tw := newTable(env.Out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "line\tpoint\tsplice class")
	for _, l := range rep.Lines {
		class := l.SpliceClass
		if l.Refused != "" {
			class += ": " + l.Refused
		}
		fmt.Fprintf(tw, "%s:%d\t%s\t%s\n", l.File, l.Line, l.Point, class)
	}
	return tw.Flush()
}

// debugForFunction opens the debug file of the kernel function cfg
// describes: the debug vmlinux, or its module's debug file.
func debugForFunction(ctx context.Context, c *api.Client, cfg api.CFG, o DebugOptions) (*debuginfo.File, error) {
	if cfg.Module == "" {
		dbg, err := debugForDaemon(ctx, c, o)
		if err != nil {
			return nil, fmt.Errorf("source lines need the kernel's debug vmlinux: %w", err)
		}
		return dbg, nil
	}
	s := moduleSearch(ctx, c, o)
	s.BuildID = cfg.ModuleBuildID
	dbg, err := debuginfo.FindModule(cfg.Module, s)
	if err != nil {
		return nil, fmt.Errorf("%s is in module %s: %w", cfg.Function, cfg.Module, err)
	}
	return dbg, nil
}

// findLoadedModule opens the debug file of the loaded module mod: of its
// build id, which kerninstd reports with the CFG of one of its functions
// (named by the first file of the module's name found; without an
// answer, that file).
func findLoadedModule(ctx context.Context, c *api.Client, mod string, o DebugOptions) (*debuginfo.File, error) {
	s := moduleSearch(ctx, c, o)
	first, err := debuginfo.FindModule(mod, s)
	if err != nil {
		return nil, err
	}
	tried := 0
	for _, sym := range first.Symbols().Symbols() {
		if sym.Kind != elfsym.Func || sym.Size == 0 {
			continue
		}
		if tried++; tried > 3 {
			break
		}
		if id := loadedBuildID(ctx, c, mod, sym.Name); id != "" {
			if first.Check(id) == nil {
				return first, nil
			}
			first.Close()
			s.BuildID = id
			return debuginfo.FindModule(mod, s)
		}
	}
	return first, nil
}

// linkAddr is the link-time address of the function cfg describes: its
// symbol in the debug file, the one of its size where several share its
// name (static functions of different files).
func linkAddr(syms *elfsym.Table, cfg api.CFG) (uint64, error) {
	found := funcsNamed(syms, cfg.Function)
	if len(found) > 1 {
		var sized []elfsym.Symbol
		for _, s := range found {
			if s.Size == cfg.Size {
				sized = append(sized, s)
			}
		}
		found = sized
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("no function symbol %s in the debug file (not this kernel's?)", cfg.Function)
	case 1:
		return found[0].Addr, nil
	}
	return 0, fmt.Errorf("%d functions named %s of %d bytes in the debug file: which one is ambiguous", len(found), cfg.Function, cfg.Size)
}
