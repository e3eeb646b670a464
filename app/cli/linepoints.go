package cli

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
)

// sourceLine matches a point that names a source line, FILE:LINE, as perf
// probe users write it (fs/namei.c:2450). The file must end in a source
// suffix: FUNC:BLOCK is a point too, and function names hold dots
// (foo.cold:2, bar.isra.0:1).
var sourceLine = regexp.MustCompile(`^(.+\.(?:c|h|S|s|rs|cc|cpp)):([0-9]+)$`)

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
	var lp linePoints
	var dbg *debuginfo.File
	defer func() {
		if dbg != nil {
			dbg.Close()
		}
	}()
	for _, p := range points {
		file, line, ok := ParseSourceLine(p)
		if !ok {
			lp.points, lp.labels = append(lp.points, p), append(lp.labels, p)
			continue
		}
		if dbg == nil {
			var err error
			if dbg, err = debugForDaemon(ctx, c, o); err != nil {
				return lp, fmt.Errorf("%s: a source line needs the kernel's debug vmlinux: %w", p, err)
			}
		}
		addrs, err := dbg.LineAddrs(file, line)
		if err != nil {
			return lp, fmt.Errorf("%s: %w (in %s)", p, err, dbg.Path)
		}
		var at []string
		for _, a := range addrs {
			spec := fmt.Sprintf("%s+%#x", a.Func, a.Off)
			lp.points, lp.labels = append(lp.points, spec), append(lp.labels, p)
			at = append(at, spec)
		}
		fmt.Fprintf(w, "kinst: %s starts at %s\n", p, strings.Join(at, ", "))
	}
	return lp, nil
}
