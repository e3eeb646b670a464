package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/report"
)

// CoverProcess is `kinst cover --user -p PID TARGET…` (or -p 0 -- CMD): a
// hit-flag probe at every block of the targets' functions in a user
// process, each removed once it has run, as kerninstd does for the
// kernel. Source lines (--lcov, --file, each block's lines) come from the
// executable's own DWARF when it has some, and a library's from its DWARF
// or its separate debug file.
func CoverProcess(ctx context.Context, pid int, o CoverOptions, env Env) (int, error) {
	if len(o.Modules) > 0 || o.Filter != (api.Filter{}) || o.Name != "" || o.TTL != 0 || o.Debug.Vmlinux != "" {
		return 2, errors.New("cover --user: --module, --comm, --name, --ttl and --vmlinux are for the kernel")
	}
	if len(o.Targets) == 0 && len(o.Files) == 0 && len(o.Callees) == 0 {
		return 2, errors.New("cover --user: name at least one function or glob (parse_*, libc:str*), --callees FUNC or --file")
	}
	if o.Depth < 1 {
		o.Depth = 1
	}
	for _, path := range []string{o.SVG, o.Lcov} {
		if err := checkOutputDir("cover", path); err != nil {
			return 2, err
		}
	}
	if _, err := parseLineRange(o); err != nil {
		return 2, err
	}
	r, err := openProcess(pid, o.Command, env)
	if err != nil {
		return 1, err
	}
	tg := r.tg
	if !o.Trap {
		// A probe at every block reaches code that runs with signals
		// blocked (thread start, fork) far more often than a point named
		// on purpose: blocks only an int3 fits are refused instead.
		tg.NoTraps(process.TrapHazard + "; --trap allows it")
	}
	fail := func(err error) (int, error) {
		tg.Close()
		r.kill()
		return 1, err
	}
	var dbg *debuginfo.File
	if o.Lcov != "" || len(o.Files) > 0 {
		exe := fmt.Sprintf("/proc/%d/exe", r.pid)
		if dbg, err = debuginfo.Open(exe); err != nil {
			return fail(fmt.Errorf("--lcov and --file need the executable's DWARF (build it with -g): %w", err))
		}
		defer dbg.Close()
		if err := fileTargets(&o, dbg, env); err != nil {
			return fail(err)
		}
	} else if d, err := debuginfo.Open(fmt.Sprintf("/proc/%d/exe", r.pid)); err == nil {
		dbg = d // lines when the executable has them; silent when not
		defer dbg.Close()
	}
	set := cover.New("")
	if o.AllBlocks {
		set.AllBlocks()
	}
	seen := map[uint64]bool{}
	var lists [][]process.CoverTarget
	var pending []string  // LIB:… targets whose library is not loaded yet
	var unmatched []error // globs that matched nothing, beside other targets
	for _, target := range o.Targets {
		fns, err := tg.Functions(target)
		if errors.Is(err, process.ErrNoLibrary) {
			pending = append(pending, target)
			fmt.Fprintf(env.Err, "kinst: %s: the library is not loaded yet; its probes are armed when the process loads it (kinst looks every %s: what runs before is not seen)\n", target, cover.Poll)
			continue
		}
		if errors.Is(err, process.ErrNoFunction) && strings.ContainsAny(target, "*?[") && len(o.Targets)+len(o.Callees) > 1 {
			// A glob over one object (the executable's '*' when it is
			// stripped) matching nothing does not stop the others.
			unmatched = append(unmatched, err)
			fmt.Fprintf(env.Err, "kinst: warning: %v\n", err)
			continue
		}
		if err != nil {
			return fail(err)
		}
		lists = append(lists, fns)
	}
	for _, root := range o.Callees {
		fns, err := tg.Callees(root, o.Depth)
		if err != nil {
			return fail(err)
		}
		lists = append(lists, fns)
	}
	if len(lists) == 0 && len(pending) == 0 && len(unmatched) > 0 {
		return fail(errors.Join(unmatched...))
	}
	add := func(fns []process.CoverTarget) (n int) {
		for _, ct := range fns {
			if seen[ct.Sym.Addr] {
				continue
			}
			seen[ct.Sym.Addr] = true
			n++
			if ct.Err != nil {
				set.AddUnreadable(ct.Sym, ct.Err)
				continue
			}
			set.Add(ct.Func)
		}
		return n
	}
	for _, fns := range lists {
		add(fns)
	}
	// The libraries' debug files are opened now: the process (and its
	// /proc/PID/root) may be gone when the report is made.
	libDebug := map[string]*debuginfo.File{}
	librariesDebug(report.Cover(set, "", time.Now()), tg, env, libDebug)
	defer func() {
		for _, d := range libDebug {
			d.Close()
		}
	}()
	set.Arm(tg, "kinst", cover.Flag(nil), time.Now)
	armed := report.Cover(set, "", time.Now())
	if armed.Armed == 0 && armed.TotalBlocks > 0 && len(pending) == 0 {
		// Nothing to measure: say why, rather than report 0% after the
		// whole duration.
		why := "every block was refused"
	first:
		for _, f := range armed.Functions {
			for _, b := range f.Blocks {
				if b.Refused != nil {
					why = *b.Refused
					break first
				}
			}
		}
		return fail(fmt.Errorf("cover --user: no probe could be armed over %d blocks: %s", armed.TotalBlocks, why))
	}
	fmt.Fprintf(env.Err, "kinst: %d probes armed in process %d in %s over %d blocks of %d functions (%d inferred from their successors, %d refused)\n",
		armed.Armed, r.pid, fmtNS(float64(armed.ArmNS)), armed.TotalBlocks, len(armed.Functions), armed.Inferred, armed.RefusedBlocks)
	writeRefusals(env.Err, armed, 3)
	start := time.Now()
	// load arms the pending targets whose library the process has
	// loaded since (dlopen).
	load := func() {
		if !r.loaded(len(pending)) {
			return
		}
		var still []string
		for _, target := range pending {
			fns, err := tg.Functions(target)
			if errors.Is(err, process.ErrNoLibrary) {
				still = append(still, target)
				continue
			}
			if err != nil {
				fmt.Fprintf(env.Err, "kinst: %s: %v\n", target, err)
				continue
			}
			before := set.Summary(time.Now()).Armed
			n := add(fns)
			set.Arm(tg, "kinst", cover.Flag(nil), time.Now)
			now := report.Cover(set, "", time.Now())
			fmt.Fprintf(env.Err, "kinst: %s: loaded %s after the start: %d probes armed over %d functions (%d named by other targets)\n",
				target, time.Since(start).Round(time.Millisecond), now.Armed-before, n, len(fns)-n)
			librariesDebug(now, tg, Env{Err: io.Discard}, libDebug)
		}
		pending = still
	}
	sweep := func() {
		load()
		failed := set.Sweep(tg, time.Now())
		if len(failed) > 0 && !r.live() {
			return // it exited meanwhile: nothing is left to remove
		}
		for req, err := range failed {
			fmt.Fprintf(env.Err, "kinst: remove the covered probe at %s: %v\n", req.Site().Where(), err)
		}
	}
	if o.Duration == 0 && r.cmd == nil {
		fmt.Fprintln(env.Err, "kinst: covering; Ctrl-C to stop")
	}
	dur := r.run(ctx, o.Duration, cover.Poll, func(time.Duration) { sweep() })
	if r.live() {
		sweep() // the last hits count
	} else {
		// The process has gone, and its text with it: its flags are
		// still in kinst's mapping, nothing is left to remove.
		set.Mark(tg, time.Now())
	}
	for _, target := range pending {
		fmt.Fprintf(env.Err, "kinst: %s: the library was not seen loaded (kinst looks every %s): nothing of it was covered\n", target, cover.Poll)
	}
	status := r.finish(func() []error {
		_, err := set.Remove(tg)
		return []error{err}
	}, env.Err)
	rep := *report.Cover(set, fmt.Sprintf("process %d", r.pid), time.Now())
	rep.DurationNS = int64(dur)
	rep.ExitStatus = status
	rep.Ended = r.end
	exit := 0
	if status != nil {
		exit = *status
	}
	if dbg != nil {
		if _, err := Annotate(&rep, dbg); err != nil && o.Lcov != "" {
			fmt.Fprintf(env.Err, "kinst: no source lines: %v\n", err)
		}
	}
	for mod, dbg := range libDebug {
		if _, err := AnnotateModule(&rep, dbg, mod); err != nil {
			fmt.Fprintf(env.Err, "kinst: no source lines for %s: %v\n", mod, err)
		}
	}
	return writeCoverOutputs(o, rep, exit, env)
}

// librariesDebug opens into out the DWARF of each library the report has
// functions of and out has not: its own, or its separate debug file by
// build id under /usr/lib/debug/.build-id (Debian's -dbg and -dbgsym
// packages: libc6-dbg for libc). A library without either gets no lines,
// said once.
func librariesDebug(rep *api.CoverReport, tg *process.Target, env Env, out map[string]*debuginfo.File) {
	seen := map[string]bool{}
	var none []string
	for _, f := range rep.Functions {
		if _, open := out[f.Module]; f.Module == "" || seen[f.Module] || open {
			continue
		}
		seen[f.Module] = true
		dbg, err := debuginfo.OpenOrFind(tg.Path(f.Module))
		if errors.Is(err, debuginfo.ErrNoDebugInfo) {
			none = append(none, f.Module)
			continue
		}
		if err != nil {
			fmt.Fprintf(env.Err, "kinst: no source lines for %s: %v\n", f.Module, err)
			continue
		}
		out[f.Module] = dbg
	}
	if len(none) > 0 {
		fmt.Fprintf(env.Err, "kinst: no source lines for %s: no DWARF, nor a debug file by build id under /usr/lib/debug (install the -dbg or -dbgsym package)\n", strings.Join(none, ", "))
	}
}

// writeRefusals prints the most common reasons blocks were refused, at
// most top of them, with how many blocks each (the report has every
// block's own).
func writeRefusals(w io.Writer, rep *api.CoverReport, top int) {
	why := map[string]int{}
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.Refused != nil {
				why[refusalKind(*b.Refused)]++
			}
		}
	}
	reasons := make([]string, 0, len(why))
	for r := range why {
		reasons = append(reasons, r)
	}
	sort.Slice(reasons, func(i, j int) bool {
		if why[reasons[i]] != why[reasons[j]] {
			return why[reasons[i]] > why[reasons[j]]
		}
		return reasons[i] < reasons[j]
	})
	for i, r := range reasons {
		if i == top {
			fmt.Fprintf(w, "kinst:   … %d more kinds of reason (the report names each block's)\n", len(reasons)-top)
			break
		}
		fmt.Fprintf(w, "kinst:   %d blocks refused: %s\n", why[r], r)
	}
}

// blockInsn is an instruction a block refusal names before its reason
// ("+0x12 retq: "): the same reason at another offset is the same kind.
var blockInsn = regexp.MustCompile(`(^|; )\+0x[0-9a-f]+ .*?: `)

// refusalKind is a block's refusal without the offsets and instructions
// of "no instruction of the block may be spliced: +0xOFF INSN: WHY; …"
// (each reason once per block already), so the summary counts blocks by
// why, not by where.
func refusalKind(why string) string {
	const none = "no instruction of the block may be spliced: "
	rest, ok := strings.CutPrefix(why, none)
	if !ok {
		return why
	}
	return none + blockInsn.ReplaceAllString(rest, "$1")
}
