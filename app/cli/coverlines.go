package cli

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/internal/outfile"
	"github.com/kinst/kinst/report"
	"golang.org/x/sys/unix"
)

// Source lines of coverage reports. The daemon reports runtime addresses
// only; kinst maps them to source lines here, on the client, with a debug
// vmlinux (Debian's linux-image-RELEASE-dbg), so a report saved with
// --json can be annotated on another machine.

// DebugOptions say which debug vmlinux gives source lines.
type DebugOptions struct {
	Vmlinux string // --vmlinux; "" looks the running kernel's up (debuginfo.Find)
	// ModuleDirs are searched first for kernel modules' debug files
	// (--module-debug; debuginfo.FindModule).
	ModuleDirs []string
}

// kernelDebug is what gives a kernel report source lines: the debug
// vmlinux (nil: none at hand) and where each module's debug file is
// looked up.
type kernelDebug struct {
	vmlinux *debuginfo.File
	modules debuginfo.ModuleSearch
	// buildID is the build id of the loaded module mod, which holds the
	// function fn ("" unknown; nil: not asked).
	buildID func(mod, fn string) string
}

// daemonDebug is kernelDebug for the kernel kerninstd runs.
func daemonDebug(ctx context.Context, c *api.Client, vmlinux *debuginfo.File, o DebugOptions) kernelDebug {
	return kernelDebug{vmlinux: vmlinux, modules: moduleSearch(ctx, c, o), buildID: func(mod, fn string) string {
		return loadedBuildID(ctx, c, mod, fn)
	}}
}

// loadedBuildID is the build id of the loaded module mod, which kerninstd
// reports with the CFG of its function fn; "" when it does not say (or
// fn is not mod's).
func loadedBuildID(ctx context.Context, c *api.Client, mod, fn string) string {
	cfg, err := c.CFG(ctx, fn)
	if err != nil || cfg.Module != mod {
		return ""
	}
	return cfg.ModuleBuildID
}

// moduleSearch is where the modules' debug files of the kernel kerninstd
// runs are looked up.
func moduleSearch(ctx context.Context, c *api.Client, o DebugOptions) debuginfo.ModuleSearch {
	s := debuginfo.ModuleSearch{Dirs: o.ModuleDirs}
	if in, err := c.Info(ctx); err == nil {
		s.Release = in.KernelRelease
	}
	return s
}

// openDebugInfo opens --vmlinux, else finds the debug vmlinux of the
// kernel kerninstd runs (release from release, or the local one when ""):
// by the local build id when the local kernel is that release, then by
// release under /usr/lib/debug.
func openDebugInfo(o DebugOptions, release string) (*debuginfo.File, error) {
	if o.Vmlinux != "" {
		return debuginfo.Open(o.Vmlinux)
	}
	local := localRelease()
	s := debuginfo.Search{Release: release}
	if s.Release == "" {
		s.Release = local
	}
	if s.Release == local {
		s.BuildID, _ = debuginfo.KernelBuildID("/sys/kernel/notes")
	}
	return debuginfo.Find(s)
}

// localRelease is this machine's kernel release (uname -r); "" if
// unknown.
func localRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// annotateOrSay annotates the report's kernel functions when the debug
// vmlinux is at hand and its modules' functions from each module's debug
// file, and says on w what it did or why it could not; lines then stay
// empty.
func annotateOrSay(w io.Writer, rep *api.CoverReport, d kernelDebug) {
	if d.vmlinux != nil {
		a, err := report.Annotate(rep, d.vmlinux)
		if err != nil {
			fmt.Fprintf(w, "kinst: no source lines: %v\n", err)
		} else {
			sayAnnotation(a, w, d.vmlinux.Path)
		}
	}
	annotateModules(w, rep, d.modules, d.buildID)
}

// annotateModules gives the functions of each module of the report
// source lines from the module's debug file (its DWARF relocated against
// its sections, whose load addresses the report's functions vote), and
// says on w which modules it found none for.
func annotateModules(w io.Writer, rep *api.CoverReport, s debuginfo.ModuleSearch, buildID func(mod, fn string) string) {
	fnOf := map[string]string{} // a function of each module
	var mods []string
	for _, f := range rep.Functions {
		if f.Module != "" && f.Error == "" && fnOf[f.Module] == "" {
			fnOf[f.Module] = f.Function
			mods = append(mods, f.Module)
		}
	}
	slices.Sort(mods)
	for _, m := range mods {
		s := s
		if buildID != nil {
			s.BuildID = buildID(m, fnOf[m])
		}
		dbg, err := debuginfo.FindModule(m, s)
		if err != nil {
			var nf *debuginfo.NotFoundError
			if errors.As(err, &nf) {
				fmt.Fprintf(w, "kinst: no source lines for module %s: %s\n", m, nf.Brief())
			} else {
				fmt.Fprintf(w, "kinst: no source lines for module %s: %v\n", m, err)
			}
			continue
		}
		a, err := report.AnnotateModule(rep, dbg, m)
		dbg.Close()
		if err != nil {
			fmt.Fprintf(w, "kinst: no source lines for module %s: %v\n", m, err)
			continue
		}
		if len(a.Unmatched) > 0 {
			fmt.Fprintf(w, "kinst: no source lines for %d functions %s does not have where the report puts them: %s\n",
				len(a.Unmatched), dbg.Path, short(a.Unmatched))
		}
	}
}

// say tells on w which functions got no lines, and why.
func sayAnnotation(a report.Annotation, w io.Writer, vmlinux string) {
	if len(a.Unmatched) > 0 {
		fmt.Fprintf(w, "kinst: no source lines for %d functions %s does not have where the report puts them: %s\n",
			len(a.Unmatched), vmlinux, short(a.Unmatched))
	}
}

// short lists up to five names.
func short(names []string) string {
	if len(names) > 5 {
		return strings.Join(names[:5], ", ") + ", …"
	}
	return strings.Join(names, ", ")
}

// splitLine splits "file:line".
func splitLine(s string) (string, int, bool) {
	i := strings.LastIndexByte(s, ':')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(s[i+1:])
	return s[:i], n, err == nil
}

// WriteLcov writes an annotated report (see Annotate) as an lcov
// tracefile: per source file (SF), the functions that start in it (FN at
// the line of their first instruction, FNDA 1 when any of their blocks
// ran) and every line of a probed block (DA 1 when a covered block has
// the line, else 0). Lines only refused blocks have are left out: kinst
// cannot say whether they ran. Functions without lines (modules) are
// left out. Files, functions and lines are sorted.
func WriteLcov(w io.Writer, rep api.CoverReport) error {
	files := lcovFiles(rep)
	if len(files) == 0 {
		return errors.New("lcov: the report has no source lines (no debug vmlinux, or only functions of modules)")
	}
	bw := bufio.NewWriter(w)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	tn := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, rep.Session)
	for _, name := range names {
		fmt.Fprintf(bw, "TN:%s\nSF:%s\n", tn, name)
		files[name].write(bw)
	}
	return bw.Flush()
}

// lcovFunc is a function of an lcov record: its first line, and whether
// any of its blocks ran.
type lcovFunc struct {
	name string
	line int
	hit  bool
}

// lcovFile is one source file's lcov record.
type lcovFile struct {
	fns   []lcovFunc
	lines map[int]bool // line → covered
}

// lcovFiles gathers the report's functions and lines by source file.
func lcovFiles(rep api.CoverReport) map[string]*lcovFile {
	files := map[string]*lcovFile{}
	get := func(name string) *lcovFile {
		f := files[name]
		if f == nil {
			f = &lcovFile{lines: map[int]bool{}}
			files[name] = f
		}
		return f
	}
	for _, f := range rep.Functions {
		var first string
		hit := false
		for _, b := range f.Blocks {
			if len(b.Lines) > 0 && first == "" && b.Index == 0 {
				first = b.Lines[0]
			}
			if b.Refused != nil {
				continue
			}
			hit = hit || b.Covered
			for _, l := range b.Lines {
				if name, n, ok := splitLine(l); ok {
					lf := get(name)
					lf.lines[n] = lf.lines[n] || b.Covered
				}
			}
		}
		if first == "" {
			for _, b := range f.Blocks {
				if len(b.Lines) > 0 {
					first = b.Lines[0]
					break
				}
			}
		}
		if name, n, ok := splitLine(first); ok {
			lf := get(name)
			lf.fns = append(lf.fns, lcovFunc{name: f.Function, line: n, hit: hit})
		}
	}
	return files
}

// write writes the record's functions and lines, after its TN and SF.
func (f *lcovFile) write(bw *bufio.Writer) {
	slices.SortFunc(f.fns, func(a, b lcovFunc) int { return cmp.Or(a.line-b.line, strings.Compare(a.name, b.name)) })
	hit := 0
	for _, x := range f.fns {
		fmt.Fprintf(bw, "FN:%d,%s\n", x.line, x.name)
	}
	for _, x := range f.fns {
		n := 0
		if x.hit {
			n, hit = 1, hit+1
		}
		fmt.Fprintf(bw, "FNDA:%d,%s\n", n, x.name)
	}
	fmt.Fprintf(bw, "FNF:%d\nFNH:%d\n", len(f.fns), hit)
	lines := make([]int, 0, len(f.lines))
	for l := range f.lines {
		lines = append(lines, l)
	}
	slices.Sort(lines)
	covered := 0
	for _, l := range lines {
		n := 0
		if f.lines[l] {
			n, covered = 1, covered+1
		}
		fmt.Fprintf(bw, "DA:%d,%d\n", l, n)
	}
	fmt.Fprintf(bw, "LF:%d\nLH:%d\nend_of_record\n", len(lines), covered)
}

// writeLcovFile writes the lcov tracefile to path.
func writeLcovFile(path string, rep api.CoverReport) error {
	return outfile.Write(path, func(w io.Writer) error { return WriteLcov(w, rep) })
}

// readCoverReport reads a report saved by kinst cover --json.
func readCoverReport(path string) (api.CoverReport, error) {
	var rep api.CoverReport
	b, err := os.ReadFile(path)
	if err != nil {
		return rep, err
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return rep, fmt.Errorf("%s: not a kinst cover --json report: %w", path, err)
	}
	if rep.Functions == nil {
		return rep, fmt.Errorf("%s: not a kinst cover --json report (no \"functions\")", path)
	}
	return rep, nil
}

// CoverLcovOptions are the flags of kinst cover lcov.
type CoverLcovOptions struct {
	Report string // a kinst cover --json report
	Debug  DebugOptions
}

// CoverLcov writes a saved report's lcov tracefile to env.Out, with
// source lines from the debug vmlinux.
func CoverLcov(o CoverLcovOptions, env Env) error {
	rep, err := readCoverReport(o.Report)
	if err != nil {
		return err
	}
	// A report that carries its lines (a process's: kinst cover --user
	// reads each binary's DWARF when it ends) is written as it is; only
	// a kernel report without them needs the debug vmlinux.
	if o.Debug.Vmlinux == "" && reportHasLines(rep) {
		return WriteLcov(env.Out, rep)
	}
	if strings.HasPrefix(rep.Session, "process ") && o.Debug.Vmlinux == "" {
		return fmt.Errorf("lcov needs source lines, and the report of %s has none: its binaries had no DWARF and no debug file by build id when it ended (install their -dbg or -dbgsym packages and run it again)", rep.Session)
	}
	dbg, err := openDebugInfo(o.Debug, "")
	if err != nil {
		return fmt.Errorf("lcov needs source lines: %w", err)
	}
	defer dbg.Close()
	a, err := report.Annotate(&rep, dbg)
	if err != nil {
		return err
	}
	sayAnnotation(a, env.Err, dbg.Path)
	annotateModules(env.Err, &rep, debuginfo.ModuleSearch{Dirs: o.Debug.ModuleDirs, Release: localRelease()}, nil)
	return WriteLcov(env.Out, rep)
}

// reportHasLines reports whether any block of rep has source lines.
func reportHasLines(rep api.CoverReport) bool {
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if len(b.Lines) > 0 {
				return true
			}
		}
	}
	return false
}

// CoverReportOptions are the flags of kinst cover report.
type CoverReportOptions struct {
	Session string
	JSON    bool
	Lcov    string // also write an lcov tracefile here
	Debug   DebugOptions
}

// CoverReport prints the live state of a running coverage session, as
// the final report would show it now.
func CoverReport(ctx context.Context, c *api.Client, o CoverReportOptions, env Env) error {
	rep, err := c.CoverReport(ctx, o.Session)
	if isNoSession(err) {
		return fmt.Errorf("no session %q (see kinst ls)", o.Session)
	}
	if err != nil {
		return err
	}
	if err := coverLines(ctx, c, rep, o.Debug, o.Lcov != "", env); err != nil {
		return err
	}
	if o.Lcov != "" {
		if err := writeLcovFile(o.Lcov, *rep); err != nil {
			return err
		}
	}
	if o.JSON {
		return writeJSON(env.Out, rep)
	}
	return writeCover(env.Out, *rep)
}

// coverLines annotates rep with source lines. Without --vmlinux and
// --lcov a missing debug vmlinux is said on stderr and the lines stay
// empty; with either, it is an error.
func coverLines(ctx context.Context, c *api.Client, rep *api.CoverReport, o DebugOptions, need bool, env Env) error {
	dbg, err := debugForDaemon(ctx, c, o)
	if err != nil {
		if need || o.Vmlinux != "" {
			return err
		}
		sayNoLines(env.Err, err)
	} else {
		defer dbg.Close()
	}
	annotateOrSay(env.Err, rep, daemonDebug(ctx, c, dbg, o))
	return nil
}

// sayNoLines says on w why the lines stay empty.
func sayNoLines(w io.Writer, err error) {
	var nf *debuginfo.NotFoundError
	if errors.As(err, &nf) {
		fmt.Fprintf(w, "kinst: source lines left empty: %s\n", nf.Brief())
		return
	}
	fmt.Fprintf(w, "kinst: source lines left empty: %v\n", err)
}

// debugForDaemon opens the debug vmlinux of the kernel kerninstd runs.
func debugForDaemon(ctx context.Context, c *api.Client, o DebugOptions) (*debuginfo.File, error) {
	release := ""
	if o.Vmlinux == "" {
		if in, err := c.Info(ctx); err == nil {
			release = in.KernelRelease
		}
	}
	return openDebugInfo(o, release)
}

// coverDebug opens the debug vmlinux for kinst cover before anything is
// armed, and expands --file targets to the functions of those files. It
// is an error without one when --vmlinux, --lcov or --file ask for it;
// else a nil file, said on stderr, and the lines stay empty.
func coverDebug(ctx context.Context, c *api.Client, o *CoverOptions, env Env) (*debuginfo.File, error) {
	kernelFiles := 0 // --file of the kernel image's sources; MODULE:FILE are a module's
	for _, f := range o.Files {
		if mod, _ := splitModuleFile(f); mod == "" {
			kernelFiles++
		}
	}
	need := o.Debug.Vmlinux != "" || o.Lcov != "" || kernelFiles > 0
	dbg, err := debugForDaemon(ctx, c, o.Debug)
	if err != nil {
		if need {
			why := "--lcov"
			if kernelFiles > 0 {
				why = "--file"
			}
			if o.Debug.Vmlinux != "" {
				return nil, err
			}
			return nil, fmt.Errorf("%s needs source lines: %w", why, err)
		}
		sayNoLines(env.Err, err)
		dbg = nil
	}
	mods := map[string]*debuginfo.File{}
	defer func() {
		for _, f := range mods {
			f.Close()
		}
	}()
	err = fileTargets(o, func(mod string) (*debuginfo.File, error) {
		if mod == "" {
			if dbg == nil {
				return nil, errors.New("the kernel's sources need its debug vmlinux")
			}
			return dbg, nil
		}
		if mods[mod] == nil {
			f, err := findLoadedModule(ctx, c, mod, o.Debug)
			if err != nil {
				return nil, err
			}
			mods[mod] = f
		}
		return mods[mod], nil
	}, env)
	if err != nil {
		if dbg != nil {
			dbg.Close()
			err = fmt.Errorf("%w (in %s)", err, dbg.Path)
		}
		return nil, err
	}
	return dbg, nil
}

// moduleFuncs are a module's functions of fns that can be covered by
// name: not those of its init sections (freed once it loaded), and
// init_module and cleanup_module, which every module has, by another name
// of the same code when there is one.
func moduleFuncs(dbg *debuginfo.File, fns []debuginfo.Func) []debuginfo.Func {
	var out []debuginfo.Func
	for _, f := range fns {
		if s, ok := dbg.SectionAt(f.Addr); ok && strings.HasPrefix(s.Name, ".init") {
			continue
		}
		if f.Name == "init_module" || f.Name == "cleanup_module" {
			for _, s := range dbg.Symbols().Symbols() {
				if s.Addr == f.Addr && s.Kind == elfsym.Func && s.Name != f.Name {
					f.Name = s.Name
					break
				}
			}
		}
		out = append(out, f)
	}
	return out
}

// fileTargets adds to o's targets the functions of its --file sources
// (and, with --lines, only those holding a line of the range), from dbg.
func fileTargets(o *CoverOptions, open func(mod string) (*debuginfo.File, error), env Env) error {
	r, err := parseLineRange(*o)
	if err != nil {
		return err
	}
	if r != nil {
		dbg, err := open(r.module)
		if err != nil {
			return fmt.Errorf("--file %s: %w", o.Files[0], err)
		}
		fns, err := r.funcs(dbg)
		if err != nil {
			return fmt.Errorf("--file %s --lines %s: %w", o.Files[0], o.Lines, err)
		}
		o.Targets = append(o.Targets, fns...)
		fmt.Fprintf(env.Err, "kinst: %s: %d functions\n", r, len(fns))
		return nil
	}
	for _, file := range o.Files {
		mod, name := splitModuleFile(file)
		dbg, err := open(mod)
		if err != nil {
			return fmt.Errorf("--file %s: %w", file, err)
		}
		fns, err := dbg.FuncsInFile(name)
		if err != nil {
			return fmt.Errorf("--file %s: %w", file, err)
		}
		if mod != "" {
			fns = moduleFuncs(dbg, fns)
		}
		for _, f := range fns {
			o.Targets = append(o.Targets, f.Name)
		}
		fmt.Fprintf(env.Err, "kinst: %s: %d functions\n", file, len(fns))
	}
	return nil
}

// hasLines reports whether any block of f has source lines.
func hasLines(f api.CoverFunction) bool {
	for _, b := range f.Blocks {
		if len(b.Lines) > 0 {
			return true
		}
	}
	return false
}
