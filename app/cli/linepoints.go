package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/internal/elfsym"
)

// sourceLine matches a point that names a source line, FILE:LINE, as perf
// probe users write it (fs/namei.c:2450). The file must end in a source
// suffix: FUNC:BLOCK is a point too, and function names hold dots
// (foo.cold:2, bar.isra.0:1).
var sourceLine = regexp.MustCompile(`^(.+\.(?:c|h|S|s|rs|cc|cpp|cxx|hh|hpp|hxx|go)):([0-9]+)$`)

// relativeLine matches FUNC:+N, a line counted from the line FUNC is
// declared at (perf probe's relative line).
var relativeLine = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_.]*):\+([0-9]+)$`)

// ParseRelativeLine splits a FUNC:+N point; ok is false for other points.
func ParseRelativeLine(point string) (fn string, n int, ok bool) {
	m := relativeLine.FindStringSubmatch(point)
	if m == nil {
		return "", 0, false
	}
	n, err := strconv.Atoi(m[2])
	if err != nil {
		return "", 0, false
	}
	return m[1], n, true
}

// IsLinePoint reports whether a point names a source line (FILE:LINE or
// FUNC:+N).
func IsLinePoint(p string) bool {
	_, _, a := ParseSourceLine(p)
	_, _, b := ParseRelativeLine(p)
	return a || b
}

// ParseSourceLine splits a FILE:LINE point; ok is false for other points.
func ParseSourceLine(point string) (file string, line int, ok bool) {
	m := sourceLine.FindStringSubmatch(point)
	if m == nil {
		return "", 0, false
	}
	n, err := strconv.Atoi(m[2])
	if err != nil || n <= 0 {
		return "", 0, false
	}
	return m[1], n, true
}

// linePoints are a command's points with every FILE:LINE replaced by the
// places its code starts (debuginfo.LineAddrs: one per function holding
// it, inlined copies included), as FUNC+0xOFF, which kerninstd resolves
// and checks as any point. labels[i] is what points[i] was asked as: the
// source line for an expanded one, else the point itself.
type linePoints struct {
	points, labels []string
}

// expandSourceLines expands the FILE:LINE points of points with the debug
// vmlinux of the kernel kerninstd runs (--vmlinux, else found). Without
// any FILE:LINE it opens nothing. The mapping is said on w.
func expandSourceLines(ctx context.Context, c *api.Client, points []string, o DebugOptions, w io.Writer) (linePoints, error) {
	return expandLines(points, w, func() (*debuginfo.File, error) {
		dbg, err := debugForDaemon(ctx, c, o)
		if err != nil {
			return nil, fmt.Errorf("a source line needs the kernel's debug vmlinux: %w", err)
		}
		return dbg, nil
	}, func(fn, mod string) (*debuginfo.File, string, error) {
		// MODULE:FILE:LINE, or FUNC:+N of a module's function: from
		// the module's debug file.
		// Its points name the module (MODULE:FUNC+0xOFF): a static
		// function's name may be the core kernel's too.
		if mod != "" {
			f, err := findLoadedModule(ctx, c, mod, o)
			return f, kernelModule(mod) + ":", err
		}
		cfg, err := c.CFG(ctx, fn)
		if err != nil {
			return nil, "", err
		}
		if cfg.Module == "" {
			return nil, "", fmt.Errorf("%s is not in a module", fn)
		}
		f, err := debugForFunction(ctx, c, cfg, o)
		return f, cfg.Module + ":", err
	})
}

// kernelModule is a module's name as the kernel keeps it (kallsyms,
// /sys/module): dashes are underscores.
func kernelModule(mod string) string { return strings.ReplaceAll(mod, "-", "_") }

// modulePrefix matches MODULE: before a kernel module's source file.
var modulePrefix = regexp.MustCompile(`^([A-Za-z0-9_-]+):(.+)$`)

// splitModuleFile splits MODULE:FILE (a kernel module's source file, in
// --file, a line point or a timed range) into the module and the rest;
// mod is "" for a file alone.
func splitModuleFile(f string) (mod, rest string) {
	if m := modulePrefix.FindStringSubmatch(f); m != nil {
		return m[1], m[2]
	}
	return "", f
}

// splitModule splits MODULE:FILE:LINE into the module and FILE:LINE; mod
// is "" for a point without one.
func splitModule(p string) (mod, rest string) {
	if _, _, ok := ParseSourceLine(p); !ok {
		return "", p
	}
	return splitModuleFile(p)
}

// noFunctionError is a FUNC:+N point whose function the debug file does
// not have.
type noFunctionError struct{ point, fn string }

func (e *noFunctionError) Error() string {
	return fmt.Sprintf("no function %s in the debug file", e.fn)
}

// expandLines expands the line points of points with the debug file
// open returns, opened at the first line point and closed at the end. A
// MODULE:FILE:LINE is looked up in the file other gives for the module,
// and a FUNC:+N whose function open's file does not have in the file it
// gives for the function (other nil: neither is taken).
func expandLines(points []string, w io.Writer, open func() (*debuginfo.File, error), other func(fn, mod string) (*debuginfo.File, string, error)) (linePoints, error) {
	var lp linePoints
	var dbg *debuginfo.File
	var others []*debuginfo.File
	defer func() {
		for _, f := range append(others, dbg) {
			if f != nil {
				f.Close()
			}
		}
	}()
	for _, p := range points {
		if !IsLinePoint(p) {
			lp.points, lp.labels = append(lp.points, p), append(lp.labels, p)
			continue
		}
		var addrs []debuginfo.LineAddr
		if mod, rest := splitModule(p); mod != "" {
			if other == nil {
				return lp, fmt.Errorf("%s: a module's source line (MODULE:FILE:LINE) is the kernel's", p)
			}
			f, prefix, err := other("", mod)
			if err != nil {
				return lp, fmt.Errorf("%s: %w", p, err)
			}
			others = append(others, f)
			if addrs, err = lineAddrs(f, rest); err != nil {
				return lp, fmt.Errorf("%s: %w (in %s)", p, err, f.Path)
			}
			lp.add(w, p, prefix, addrs)
			continue
		}
		if dbg == nil {
			var err error
			if dbg, err = open(); err != nil {
				return lp, fmt.Errorf("%s: %w", p, err)
			}
		}
		addrs, err := lineAddrs(dbg, p)
		prefix := ""
		if nf := (*noFunctionError)(nil); errors.As(err, &nf) && other != nil {
			f, pre, oerr := other(nf.fn, "")
			if oerr != nil {
				return lp, fmt.Errorf("%s: %w (in %s), and %v", p, err, dbg.Path, oerr)
			}
			others = append(others, f)
			if addrs, err = lineAddrs(f, p); err != nil {
				return lp, fmt.Errorf("%s: %w (in %s)", p, err, f.Path)
			}
			prefix = pre
		} else if err != nil {
			return lp, fmt.Errorf("%s: %w (in %s)", p, err, dbg.Path)
		}
		lp.add(w, p, prefix, addrs)
	}
	return lp, nil
}

// add puts the places of line point p in lp as FUNC+0xOFF points named
// by p (prefix before each: a process's library, LIB:), and says them on
// w.
func (lp *linePoints) add(w io.Writer, p, prefix string, addrs []debuginfo.LineAddr) {
	var at []string
	for _, a := range addrs {
		spec := fmt.Sprintf("%s%s+%#x", prefix, a.Func, a.Off)
		lp.points, lp.labels = append(lp.points, spec), append(lp.labels, p)
		at = append(at, spec)
	}
	fmt.Fprintf(w, "kinst: %s starts at %s\n", p, strings.Join(at, ", "))
}

// label is what the i-th point was asked as: its source line, or the
// point itself (asked) when it was not a line.
func (lp linePoints) label(i int, asked string) string {
	if i < len(lp.labels) {
		return lp.labels[i]
	}
	return asked
}

// funcsNamed are the function symbols called name.
func funcsNamed(syms *elfsym.Table, name string) []elfsym.Symbol {
	var out []elfsym.Symbol
	for _, s := range syms.Symbols() {
		if s.Name == name && s.Kind == elfsym.Func {
			out = append(out, s)
		}
	}
	return out
}

// lineAddrs are the places a line point's code starts: FILE:LINE's in
// every function holding it; FUNC:+N's in FUNC only, N lines after the
// line FUNC is declared at.
func lineAddrs(dbg *debuginfo.File, p string) ([]debuginfo.LineAddr, error) {
	if file, line, ok := ParseSourceLine(p); ok {
		return dbg.LineAddrs(file, line)
	}
	fn, n, _ := ParseRelativeLine(p)
	at := funcsNamed(dbg.Symbols(), fn)
	switch {
	case len(at) == 0:
		return nil, &noFunctionError{point: p, fn: fn}
	case len(at) > 1:
		return nil, fmt.Errorf("%d functions are named %s: name the line as FILE:LINE", len(at), fn)
	}
	decl, err := dbg.DeclLine(at[0].Addr)
	if err != nil {
		return nil, err
	}
	line := decl.Line + n
	all, err := dbg.LineAddrs(decl.File, line)
	if err != nil {
		return nil, fmt.Errorf("%s is declared at %s, so the line is %s:%d: %w", fn, decl, decl.File, line, err)
	}
	var in []debuginfo.LineAddr
	for _, a := range all {
		if a.Func == fn {
			in = append(in, a)
		}
	}
	if len(in) == 0 {
		return nil, fmt.Errorf("%s is declared at %s; line %d starts no code in %s itself (only in %d functions it was inlined into: name it as FILE:LINE for those)", fn, decl, line, fn, len(all))
	}
	return in, nil
}
