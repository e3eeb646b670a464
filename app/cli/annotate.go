package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/procsession"
)

// AnnotateOptions are the flags of kinst annotate.
type AnnotateOptions struct {
	Function string
	Duration time.Duration // the live run; 0: until Ctrl-C or CMD exits
	Command  []string
	From     string // a kinst cover --json report: its coverage instead of a live run
	Session  string // a running kerninstd session (NAME or ID): its coverage or counts instead
	JSON     bool
	Debug    DebugOptions
}

// AnnotateFunction prints a kernel function's instructions block by
// block, each with its source line where the line changes (from the
// debug vmlinux, when found), and per block its count over a live run
// (a counter at every block that takes one, removed at the end), its
// coverage from a saved kinst cover --json report, or what a session
// already running says of it (o.Session): perf annotate's view, by basic
// block.
func AnnotateFunction(ctx context.Context, c *api.Client, o AnnotateOptions, env Env) (int, error) {
	cfg, err := c.CFG(ctx, o.Function)
	if err != nil {
		return 1, err
	}
	var marks *blockMarks
	if o.Session != "" {
		if marks, err = sessionMarks(ctx, c, o.Session, cfg); err != nil {
			return 1, err
		}
	}
	dbg, link, err := func() (*debuginfo.File, uint64, error) {
		dbg, err := debugForFunction(ctx, c, cfg, o.Debug)
		if err != nil {
			return nil, 0, err
		}
		link, err := linkAddr(dbg.Symbols(), cfg)
		if err != nil {
			dbg.Close()
			return nil, 0, fmt.Errorf("no source lines: %w", err)
		}
		return dbg, link, nil
	}()
	if err != nil && o.Debug.Vmlinux != "" && cfg.Module == "" {
		return 1, err
	}
	return annotate(ctx, kernelTarget(ctx, c, o.Debug, env.Err), cfg, cfg, sourceOf{dbg, link, err}, o, env, marks)
}

// blockMarks are what a session already running says of a function's
// blocks: its coverage, or the counts of its probes there (by block
// index: a probe at any instruction of a block counts the block's runs).
type blockMarks struct {
	from   string // "session NAME"
	cover  *api.CoverFunction
	counts map[int]uint64
}

// sessionMarks reads the running session idOrName's marks on the
// function cfg describes: a coverage session's report of it, or the
// counts of a counting session's probes in it.
func sessionMarks(ctx context.Context, c *api.Client, idOrName string, cfg api.CFG) (*blockMarks, error) {
	sessions, err := c.Sessions(ctx)
	if err != nil {
		return nil, err
	}
	i := slices.IndexFunc(sessions, func(s api.Session) bool { return s.ID == idOrName || s.Name == idOrName })
	if i < 0 {
		return nil, fmt.Errorf("no session %q (kinst ls lists them)", idOrName)
	}
	sess := sessions[i]
	m := &blockMarks{from: "session " + idOrName}
	if sess.Cover != nil {
		rep, err := c.CoverReport(ctx, sess.ID)
		if err != nil {
			return nil, err
		}
		if m.cover, err = savedFunction(*rep, cfg); err != nil {
			return nil, fmt.Errorf("session %s: %w", idOrName, err)
		}
		return m, nil
	}
	m.counts = map[int]uint64{}
	for _, p := range sess.Probes {
		if p.Function != cfg.Function || p.Module != cfg.Module {
			continue
		}
		for _, b := range cfg.Blocks {
			if !b.Padding && len(b.Instructions) > 0 && p.Offset >= b.Instructions[0].Offset && p.Offset <= b.Instructions[len(b.Instructions)-1].Offset {
				m.counts[b.Index] = max(m.counts[b.Index], p.Count)
			}
		}
	}
	if len(m.counts) == 0 {
		return nil, fmt.Errorf("session %s has no coverage and no probe in %s", idOrName, cfg.Function)
	}
	return m, nil
}

// AnnotateProcess is AnnotateFunction for a function of the user process
// pid (FUNC or LIB:FUNC; pid 0 starts o.Command stopped at its entry point
// and counts over its run), with its source lines from the executable's
// or the library's DWARF or debug file. With o.From the process is only
// read (a command started for it is killed): its function is matched to
// the saved report's by name.
func AnnotateProcess(ctx context.Context, pid int, o AnnotateOptions, env Env) (int, error) {
	t, err := processTarget(pid, o.Command, env, procsession.Options{})
	if err != nil {
		return 1, err
	}
	cfg, err := t.proc.host.CFG(ctx, o.Function)
	if err != nil {
		t.proc.abort()
		return 1, err
	}
	dbg, link, derr := t.proc.functionDebug(cfg)
	// A process's report names a library's function as the library does,
	// the module apart: saved coverage is looked up so.
	status, err := annotate(ctx, t, cfg, unqualified(cfg), sourceOf{dbg, link, derr}, o, env, nil)
	if t.proc.end == "" {
		t.proc.abort() // no run let it go (--from, or no counter armed)
	}
	return status, err
}

// sourceOf is where annotate's source lines come from: a debug file and
// the function's link-time address in it, or why there are none.
type sourceOf struct {
	dbg  *debuginfo.File
	link uint64
	err  error
}

// annotate is kinst annotate over the function cfg describes, on target
// t: a live count (a session of t's), o.From's coverage (found as saved
// names the function), or a running session's marks.
func annotate(ctx context.Context, t sessionTarget, cfg, saved api.CFG, src sourceOf, o AnnotateOptions, env Env, marks *blockMarks) (int, error) {
	rep := output.AnnotateReport{Function: cfg.Function, Address: cfg.Address, From: "live"}
	lineOf := func(uint64) string { return "" }
	if src.err != nil {
		sayNoLines(env.Err, src.err)
	} else {
		dbg, link := src.dbg, src.link
		defer dbg.Close()
		rep.Vmlinux = dbg.Path
		lineOf = func(off uint64) string {
			l, err := dbg.LineAt(link + off)
			if err != nil || l.Line == 0 {
				return ""
			}
			return l.String()
		}
	}
	var cov *api.CoverFunction
	status := 0
	var counts map[int]uint64 // by block index, the blocks that had a counter
	switch {
	case marks != nil:
		rep.From, cov, counts = marks.from, marks.cover, marks.counts
	case o.From != "":
		file, err := readCoverReport(o.From)
		if err != nil {
			return 1, err
		}
		if cov, err = savedFunction(file, saved); err != nil {
			return 1, fmt.Errorf("%s: %w", o.From, err)
		}
		rep.From = o.From
	default:
		var err error
		counts, status, rep.DurationNS, err = countBlocks(ctx, t, cfg, o, env)
		if err != nil {
			return max(status, 1), err
		}
	}
	for _, b := range cfg.Blocks {
		if b.Padding {
			continue
		}
		ab := output.AnnotateBlock{Index: b.Index, Start: b.Start}
		n, counted := counts[b.Index]
		switch {
		case cov != nil:
			for _, cb := range cov.Blocks {
				if cb.Index != b.Index {
					continue
				}
				covered := cb.Covered
				ab.Covered = &covered
				if cb.Refused != nil {
					ab.Covered, ab.Refused = nil, *cb.Refused
				}
			}
		case counted:
			ab.Count = &n
		case marks != nil:
			ab.Refused = "no probe of the session here"
		default:
			ab.Refused = blockRefusal(b)
		}
		for _, in := range b.Instructions {
			ab.Instructions = append(ab.Instructions, output.AnnotateInsn{Offset: in.Offset, Text: in.Text, Line: lineOf(in.Offset)})
		}
		rep.Blocks = append(rep.Blocks, ab)
	}
	if o.JSON {
		return status, writeJSON(env.Out, rep)
	}
	return status, writeAnnotate(env, rep)
}

// blockRefusal is why no instruction of b takes a probe: the first
// refusal.
func blockRefusal(b api.CFGBlock) string {
	for _, in := range b.Instructions {
		if in.Refused != "" {
			return in.Refused
		}
	}
	return "no instruction takes a probe"
}

// countBlocks counts every block of cfg that takes a probe (one session,
// FUNC:BLOCK points) for the run o bounds; it returns the counts by block
// index, of the blocks that had a counter.
func countBlocks(ctx context.Context, t sessionTarget, cfg api.CFG, o AnnotateOptions, env Env) (map[int]uint64, int, int64, error) {
	var points []string
	var index []int
	for _, b := range cfg.Blocks {
		if b.Padding {
			continue
		}
		for _, in := range b.Instructions {
			if in.SpliceClass != "" && in.SpliceClass != "refused" {
				points, index = append(points, fmt.Sprintf("%s:%d", cfg.Function, b.Index)), append(index, b.Index)
				break
			}
		}
	}
	if len(points) == 0 {
		return nil, 1, 0, errors.New("no block of " + cfg.Function + " takes a probe")
	}
	sess, err := t.host.CreateSession(ctx, t.request(api.SessionRequest{Points: points}))
	if err != nil {
		return nil, 1, 0, err
	}
	fmt.Fprintf(env.Err, "kinst: counting %d of %d blocks of %s\n", len(points), nonPadding(cfg), cfg.Function)
	res, err := t.run(ctx, sess, runOptions{Duration: o.Duration, Interval: time.Second, Command: o.Command,
		Waiting: "kinst: counting; Ctrl-C to stop"}, env, func(time.Duration, api.Sample) {})
	status := res.status()
	if err != nil {
		return nil, status, 0, err
	}
	counts := map[int]uint64{}
	for i, p := range res.Final.Probes {
		if i < len(index) {
			counts[index[i]] = p.Count
		}
	}
	return counts, status, int64(res.Duration), nil
}

// writeAnnotate prints the report: a block header with its count or
// coverage, then its instructions, a source line above each instruction
// whose line differs from the one before.
func writeAnnotate(env Env, rep output.AnnotateReport) error {
	w := env.Out
	from := rep.From
	switch {
	case from == "live":
		from = fmt.Sprintf("counted over %.3f s", time.Duration(rep.DurationNS).Seconds())
	case strings.HasPrefix(from, "session ") && !slices.ContainsFunc(rep.Blocks, func(b output.AnnotateBlock) bool { return b.Covered != nil }):
		from = "counts so far of " + from
	default:
		from = "coverage from " + from
	}
	fmt.Fprintf(w, "%s at %#x: %s\n", rep.Function, uint64(rep.Address), from)
	last := ""
	for _, b := range rep.Blocks {
		mark := ""
		switch {
		case b.Count != nil:
			mark = fmt.Sprintf("%d", *b.Count)
		case b.Covered != nil && *b.Covered:
			mark = "covered"
		case b.Covered != nil:
			mark = "not covered"
		default:
			mark = "no probe: " + b.Refused
		}
		fmt.Fprintf(w, "\nblock %d  %s\n", b.Index, mark)
		for _, in := range b.Instructions {
			if in.Line != "" && in.Line != last {
				fmt.Fprintf(w, "  %s\n", in.Line)
				last = in.Line
			}
			fmt.Fprintf(w, "    %+#6x  %s\n", in.Offset, strings.TrimSpace(in.Text))
		}
	}
	return nil
}

// nonPadding is the number of cfg's blocks that are the function's (not
// the padding after it).
func nonPadding(cfg api.CFG) int {
	n := 0
	for _, b := range cfg.Blocks {
		if !b.Padding {
			n++
		}
	}
	return n
}

// savedFunction is cfg's function in a saved coverage report: at the same
// address, else (a report of an earlier boot: KASLR moved it) the one
// function of that name and module. Its blocks must be cfg's.
func savedFunction(rep api.CoverReport, cfg api.CFG) (*api.CoverFunction, error) {
	var named []*api.CoverFunction
	for i := range rep.Functions {
		f := &rep.Functions[i]
		if f.Function != cfg.Function || f.Module != cfg.Module {
			continue
		}
		if f.Address == cfg.Address {
			named = []*api.CoverFunction{f}
			break
		}
		named = append(named, f)
	}
	switch {
	case len(named) == 0:
		return nil, fmt.Errorf("no coverage of %s in it", cfg.Function)
	case len(named) > 1:
		return nil, fmt.Errorf("%d functions named %s in it, none at %#x", len(named), cfg.Function, uint64(cfg.Address))
	}
	f := named[0]
	if len(f.Blocks) != nonPadding(cfg) {
		return nil, fmt.Errorf("its %s has %d blocks, this kernel's %d: a report of another build?", cfg.Function, len(f.Blocks), nonPadding(cfg))
	}
	return f, nil
}
