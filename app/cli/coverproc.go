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
	if err := checkCoverProcess(&o); err != nil {
		return 2, err
	}
	r, err := openProcess(pid, o.Command, env)
	if err != nil {
		return 1, err
	}
	if !o.Trap {
		// A probe at every block reaches code that runs with signals
		// blocked (thread start, fork) far more often than a point named
		// on purpose: blocks only an int3 fits are refused instead.
		r.tg.NoTraps(process.TrapHazard + "; --trap allows it")
	}
	c := &procCoverage{r: r, env: env, set: cover.New(""), seen: map[uint64]bool{}, libDebug: map[string]*debuginfo.File{}}
	defer c.close()
	fail := func(err error) (int, error) {
		r.tg.Close()
		r.kill()
		return 1, err
	}
	if err := c.openDebug(&o); err != nil {
		return fail(err)
	}
	if o.AllBlocks {
		c.set.AllBlocks()
	}
	if err := c.plan(o); err != nil {
		return fail(err)
	}
	// The libraries' debug files are opened now: the process (and its
	// /proc/PID/root) may be gone when the report is made.
	librariesDebug(report.Cover(c.set, "", time.Now()), r.tg, env, c.libDebug)
	c.set.Arm(r.tg, "kinst", cover.Flag(nil), time.Now)
	if err := c.armed(); err != nil {
		return fail(err)
	}
	c.start = time.Now()
	if o.Duration == 0 && r.cmd == nil {
		fmt.Fprintln(env.Err, "kinst: covering; Ctrl-C to stop")
	}
	dur := r.run(ctx, o.Duration, cover.Poll, func(time.Duration) { c.sweep() })
	if r.live() {
		c.sweep() // the last hits count
	} else {
		// The process has gone, and its text with it: its flags are
		// still in kinst's mapping, nothing is left to remove.
		c.set.Mark(r.tg, time.Now())
	}
	for _, target := range c.pending {
		fmt.Fprintf(env.Err, "kinst: %s: the library was not seen loaded (kinst looks every %s): nothing of it was covered\n", target, cover.Poll)
	}
	status := r.finish(func() []error {
		_, err := c.set.Remove(r.tg)
		return []error{err}
	}, env.Err)
	rep := c.report(dur, status, o.Lcov != "")
	exit := 0
	if status != nil {
		exit = *status
	}
	return writeCoverOutputs(o, rep, exit, env)
}

// checkCoverProcess checks `kinst cover --user`'s options.
func checkCoverProcess(o *CoverOptions) error {
	if len(o.Modules) > 0 || o.Filter != (api.Filter{}) || o.Name != "" || o.TTL != 0 || o.Debug.Vmlinux != "" {
		return errors.New("cover --user: --module, --comm, --name, --ttl and --vmlinux are for the kernel")
	}
	if len(o.Targets) == 0 && len(o.Files) == 0 && len(o.Callees) == 0 {
		return errors.New("cover --user: name at least one function or glob (parse_*, libc:str*), --callees FUNC or --file")
	}
	if o.Depth < 1 {
		o.Depth = 1
	}
	for _, path := range []string{o.SVG, o.Lcov} {
		if err := checkOutputDir("cover", path); err != nil {
			return err
		}
	}
	_, err := parseLineRange(*o)
	return err
}

// procCoverage is a coverage session over a process, run by kinst
// itself.
type procCoverage struct {
	r   *procRun
	env Env
	set *cover.Set
	// seen are the functions planned, by address: a function two
	// targets name is planned once.
	seen map[uint64]bool
	// pending are LIB:… targets whose library is not loaded yet.
	pending []string
	// dbg is the executable's debug information, nil without; libDebug
	// the libraries', by module.
	dbg      *debuginfo.File
	libDebug map[string]*debuginfo.File
	start    time.Time
}

func (c *procCoverage) close() {
	if c.dbg != nil {
		c.dbg.Close()
	}
	for _, d := range c.libDebug {
		d.Close()
	}
}

// openDebug opens the executable's DWARF: required by --lcov and --file
// (whose targets it adds to o), taken when there otherwise.
func (c *procCoverage) openDebug(o *CoverOptions) error {
	exe := fmt.Sprintf("/proc/%d/exe", c.r.pid)
	if o.Lcov == "" && len(o.Files) == 0 {
		if d, err := debuginfo.Open(exe); err == nil {
			c.dbg = d // lines when the executable has them; silent when not
		}
		return nil
	}
	d, err := debuginfo.Open(exe)
	if err != nil {
		return fmt.Errorf("--lcov and --file need the executable's DWARF (build it with -g): %w", err)
	}
	c.dbg = d
	return fileTargets(o, d, c.env)
}

// plan plans o's targets and callees; a library's not loaded yet waits
// in pending.
func (c *procCoverage) plan(o CoverOptions) error {
	var lists [][]process.CoverTarget
	var unmatched []error // globs that matched nothing, beside other targets
	for _, target := range o.Targets {
		fns, err := c.r.tg.Functions(target)
		if errors.Is(err, process.ErrNoLibrary) {
			c.pending = append(c.pending, target)
			fmt.Fprintf(c.env.Err, "kinst: %s: the library is not loaded yet; its probes are armed when the process loads it (kinst looks every %s: what runs before is not seen)\n", target, cover.Poll)
			continue
		}
		if errors.Is(err, process.ErrNoFunction) && strings.ContainsAny(target, "*?[") && len(o.Targets)+len(o.Callees) > 1 {
			// A glob over one object (the executable's '*' when it is
			// stripped) matching nothing does not stop the others.
			unmatched = append(unmatched, err)
			fmt.Fprintf(c.env.Err, "kinst: warning: %v\n", err)
			continue
		}
		if err != nil {
			return err
		}
		lists = append(lists, fns)
	}
	for _, root := range o.Callees {
		fns, err := c.r.tg.Callees(root, o.Depth)
		if err != nil {
			return err
		}
		lists = append(lists, fns)
	}
	if len(lists) == 0 && len(c.pending) == 0 && len(unmatched) > 0 {
		return errors.Join(unmatched...)
	}
	for _, fns := range lists {
		c.add(fns)
	}
	return nil
}

// add plans the functions not planned yet, and says how many.
func (c *procCoverage) add(fns []process.CoverTarget) (n int) {
	for _, ct := range fns {
		if c.seen[ct.Sym.Addr] {
			continue
		}
		c.seen[ct.Sym.Addr] = true
		n++
		if ct.Err != nil {
			c.set.AddUnreadable(ct.Sym, ct.Err)
			continue
		}
		c.set.Add(ct.Func)
	}
	return n
}

// armed says what the first arming did, or why nothing could be
// measured (rather than report 0% after the whole duration).
func (c *procCoverage) armed() error {
	armed := report.Cover(c.set, "", time.Now())
	if armed.Armed == 0 && armed.TotalBlocks > 0 && len(c.pending) == 0 {
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
		return fmt.Errorf("cover --user: no probe could be armed over %d blocks: %s", armed.TotalBlocks, why)
	}
	fmt.Fprintf(c.env.Err, "kinst: %d probes armed in process %d in %s over %d blocks of %d functions (%d inferred from their successors, %d refused)\n",
		armed.Armed, c.r.pid, fmtNS(float64(armed.ArmNS)), armed.TotalBlocks, len(armed.Functions), armed.Inferred, armed.RefusedBlocks)
	writeRefusals(c.env.Err, armed, 3)
	return nil
}

// load arms the pending targets whose library the process has loaded
// since (dlopen).
func (c *procCoverage) load() {
	if !c.r.loaded(len(c.pending)) {
		return
	}
	var still []string
	for _, target := range c.pending {
		fns, err := c.r.tg.Functions(target)
		if errors.Is(err, process.ErrNoLibrary) {
			still = append(still, target)
			continue
		}
		if err != nil {
			fmt.Fprintf(c.env.Err, "kinst: %s: %v\n", target, err)
			continue
		}
		before := c.set.Summary(time.Now()).Armed
		n := c.add(fns)
		c.set.Arm(c.r.tg, "kinst", cover.Flag(nil), time.Now)
		now := report.Cover(c.set, "", time.Now())
		fmt.Fprintf(c.env.Err, "kinst: %s: loaded %s after the start: %d probes armed over %d functions (%d named by other targets)\n",
			target, time.Since(c.start).Round(time.Millisecond), now.Armed-before, n, len(fns)-n)
		librariesDebug(now, c.r.tg, Env{Err: io.Discard}, c.libDebug)
	}
	c.pending = still
}

// sweep arms what was loaded, then removes the probes that ran.
func (c *procCoverage) sweep() {
	c.load()
	failed := c.set.Sweep(c.r.tg, time.Now())
	if len(failed) > 0 && !c.r.live() {
		return // it exited meanwhile: nothing is left to remove
	}
	for req, err := range failed {
		fmt.Fprintf(c.env.Err, "kinst: remove the covered probe at %s: %v\n", req.Site().Where(), err)
	}
}

// report is the final report, with source lines where there is debug
// information (a failure said when lines were asked for: lcov).
func (c *procCoverage) report(dur time.Duration, status *int, lines bool) api.CoverReport {
	rep := *report.Cover(c.set, fmt.Sprintf("process %d", c.r.pid), time.Now())
	rep.DurationNS = int64(dur)
	rep.ExitStatus = status
	rep.Ended = c.r.end
	if c.dbg != nil {
		if _, err := report.Annotate(&rep, c.dbg); err != nil && lines {
			fmt.Fprintf(c.env.Err, "kinst: no source lines: %v\n", err)
		}
	}
	for mod, dbg := range c.libDebug {
		if _, err := report.AnnotateModule(&rep, dbg, mod); err != nil {
			fmt.Fprintf(c.env.Err, "kinst: no source lines for %s: %v\n", mod, err)
		}
	}
	return rep
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
