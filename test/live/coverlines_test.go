package live

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/report"
)

// hostKinst runs the host's kinst and returns its stdout and stderr; it
// fails the test on a non-zero status.
func hostKinst(t *testing.T, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(live.Bin, "kinst"), args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kinst %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), errb.String()
}

// kaslrSlide is the guest kernel's KASLR slide, from an oracle kinst does
// not use: _text in the guest's /proc/kallsyms against _text in the
// debug vmlinux.
func kaslrSlide(t *testing.T, ctx context.Context, vmlinux string) uint64 {
	t.Helper()
	f := strings.Fields(gsh(t, ctx, "grep ' _text$' /proc/kallsyms"))
	run, err := strconv.ParseUint(f[0], 16, 64)
	if err != nil {
		t.Fatalf("kallsyms _text: %q", f)
	}
	out, err := exec.Command("nm", vmlinux).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if x := strings.Fields(sc.Text()); len(x) == 3 && x[2] == "_text" {
			link, _ := strconv.ParseUint(x[0], 16, 64)
			return run - link
		}
	}
	t.Fatal("no _text in the vmlinux")
	return 0
}

// checkFirstLines: the first line of every block with lines equals
// addr2line -e VMLINUX LINKADDR, LINKADDR the block's start less the
// slide; returns how many blocks were compared.
func checkFirstLines(t *testing.T, rep api.CoverReport, vmlinux string, slide uint64) int {
	t.Helper()
	var addrs []uint64
	var firsts, where []string
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if len(b.Lines) == 0 {
				continue
			}
			addrs = append(addrs, uint64(b.Start)-slide)
			firsts = append(firsts, b.Lines[0])
			where = append(where, fmt.Sprintf("%s:%d", f.Function, b.Index))
		}
	}
	if len(addrs) == 0 {
		t.Fatal("no block has source lines")
	}
	want := debuginfotest.Addr2line(t, vmlinux, addrs)
	bad := 0
	for i := range addrs {
		if w := want[i]; firsts[i] != w {
			bad++
			if bad <= 20 {
				t.Errorf("%s (%#x): first line %s, addr2line %s", where[i], addrs[i], firsts[i], w)
			}
		}
	}
	return len(addrs)
}

// checkLcov: genhtml renders the tracefile (without the sources, which
// the host does not have), and it has records for the source files.
func checkLcov(t *testing.T, path string, wantFile string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "SF:") || !strings.Contains(string(b), wantFile) || !strings.Contains(string(b), "end_of_record") {
		t.Errorf("lcov file %s: no record of %s:\n%.1000s", path, wantFile, b)
	}
	hit := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "DA:") && strings.HasSuffix(l, ",1") {
			hit++
		}
	}
	if hit == 0 {
		t.Errorf("lcov file %s: no line hit", path)
	}
	genhtml, err := exec.LookPath("genhtml")
	if err != nil {
		t.Logf("genhtml is not installed (apt-get install lcov): tracefile not rendered")
		return
	}
	html := filepath.Join(t.TempDir(), "html")
	if out, err := exec.Command(genhtml, "--no-source", "-q", "-o", html, path).CombinedOutput(); err != nil {
		t.Errorf("genhtml %s: %v\n%s", path, err, out)
	} else if _, err := os.Stat(filepath.Join(html, "index.html")); err != nil {
		t.Errorf("genhtml made no index.html: %v", err)
	}
	t.Logf("lcov: %d bytes, %d lines hit; genhtml accepts it", len(b), hit)
}

// Source lines, on the host, of coverage taken in the guest: kinst cover
// --json in the guest (no debug vmlinux there: lines empty), then kinst
// cover lcov on the host with Debian's debug vmlinux, which genhtml must
// accept; and kinst cover --file fs/stat.c run on the host against the
// guest's kerninstd, whose blocks' first lines must equal addr2line's at
// the block's link-time address (KASLR slide from the guest's kallsyms).
func TestCoverSourceLines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	vmlinux := live.DebugVmlinux(t)
	slide := kaslrSlide(t, ctx, vmlinux)
	t.Logf("KASLR slide %#x (guest kallsyms _text against the vmlinux)", slide)

	// 1. A report taken in the guest, annotated offline on the host.
	rep := coverRun(t, ctx, "vfs_statx filename_lookup path_lookupat vfs_getattr", "kinst workload stat 300 /")
	for _, f := range rep.Functions {
		for _, b := range f.Blocks {
			if b.End <= b.Start || len(b.Lines) != 0 {
				t.Errorf("%s:%d: start %#x end %#x lines %v (the guest has no debug vmlinux)", f.Function, b.Index,
					uint64(b.Start), uint64(b.End), b.Lines)
			}
		}
	}
	dir := t.TempDir()
	saved := filepath.Join(dir, "cov.json")
	js, _ := json.Marshal(rep)
	os.WriteFile(saved, js, 0o644)
	start := time.Now()
	_, stderr := hostKinst(t, "cover", "lcov", saved, "--vmlinux", vmlinux, "-o", filepath.Join(dir, "cov.info"))
	t.Logf("kinst cover lcov: %v (opening the debug vmlinux included)%s", time.Since(start), stderr)
	checkLcov(t, filepath.Join(dir, "cov.info"), "fs/stat.c")
	dbg, err := debuginfo.Open(vmlinux)
	if err != nil {
		t.Fatal(err)
	}
	a, err := report.Annotate(&rep, dbg)
	dbg.Close()
	if err != nil || a.Slide != slide || len(a.Unmatched) > 0 {
		t.Errorf("Annotate: slide %#x (kallsyms says %#x), unmatched %v, %v", a.Slide, slide, a.Unmatched, err)
	}
	t.Logf("offline: first lines of %d blocks equal addr2line's", checkFirstLines(t, rep, vmlinux, slide))

	// 2. kinst cover --file on the host, against the guest's kerninstd,
	// under a workload in the guest. The workload starts once the session
	// is listed (armed): started on a timer instead, it could finish
	// before a slow host had opened the debug vmlinux and armed, and the
	// session then covered nothing (seen once in CI).
	start = time.Now()
	out, stderr := hostUnderStats(t, ctx, "filecov", "cover", "--addr", guest.KerninstdAddr(), "--token-file", guest.TokenFile(),
		"--file", "fs/stat.c", "--vmlinux", vmlinux, "--duration", "8s", "--json", "--lcov", filepath.Join(dir, "stat.info"), "--name", "filecov")
	t.Logf("kinst cover --file fs/stat.c: %v\n%s", time.Since(start), stderr)
	var frep api.CoverReport
	if err := json.Unmarshal([]byte(out), &frep); err != nil {
		t.Fatalf("%v:\n%.2000s", err, out)
	}
	names := map[string]bool{}
	for _, f := range frep.Functions {
		names[f.Function] = true
	}
	if !names["vfs_statx"] || !names["vfs_getattr"] || frep.CoveredBlocks == 0 {
		t.Errorf("--file fs/stat.c: %d functions (%d covered blocks), vfs_statx %v, vfs_getattr %v", len(frep.Functions),
			frep.CoveredBlocks, names["vfs_statx"], names["vfs_getattr"])
	}
	n := checkFirstLines(t, frep, vmlinux, slide)
	t.Logf("--file fs/stat.c: %d functions, %d blocks, %d covered; first lines of %d blocks equal addr2line's",
		len(frep.Functions), frep.TotalBlocks, frep.CoveredBlocks, n)
	checkLcov(t, filepath.Join(dir, "stat.info"), "fs/stat.c")
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.Sessions != 0 {
		t.Errorf("after kinst cover --file: %+v, %v", info, err)
	}
	noOops(t, ctx, "kinst cover --file")
}

// annotateSessions: kinst annotate --session marks vfs_statx from
// sessions running in kerninstd, started by other kinst commands: a
// counting session's FUNC:0 probe gives the entry block its count (at
// least the stat loop's 300; the other blocks have no probe of it), a
// coverage session's report marks the entry block covered. Nothing is
// installed by annotate: as many sessions are listed after it as before.
func annotateSessions(t *testing.T, ctx context.Context, remote []string) {
	t.Helper()
	var bg []*exec.Cmd
	defer func() {
		for _, cmd := range bg {
			cmd.Process.Signal(os.Interrupt)
			cmd.Wait()
		}
	}()
	for _, args := range [][]string{
		{"count", "vfs_statx:0", "--name", "annot-count", "--duration", "60s"},
		{"cover", "vfs_statx", "--name", "annot-cover", "--duration", "60s"},
	} {
		cmd := exec.Command(filepath.Join(live.Bin, "kinst"), append(args, remote[:4]...)...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		bg = append(bg, cmd)
		if !waitArmed(ctx, args[3]) {
			t.Fatalf("kinst %s: session never listed", strings.Join(args, " "))
		}
	}
	gsh(t, ctx, "kinst workload stat 300 / >/dev/null 2>&1")
	before, _ := client.Sessions(ctx)
	for _, name := range []string{"annot-count", "annot-cover"} {
		out, _ := hostKinst(t, append([]string{"annotate", "vfs_statx", "--session", name, "--json"}, remote...)...)
		var rep output.AnnotateReport
		if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Blocks) < 2 {
			t.Fatalf("kinst annotate --session %s: %v\n%.2000s", name, err, out)
		}
		if rep.From != "session "+name {
			t.Errorf("--session %s: from %q", name, rep.From)
		}
		b := rep.Blocks[0]
		t.Logf("kinst annotate vfs_statx --session %s: entry block count %v, covered %v", name, deref(b.Count), deref(b.Covered))
		switch name {
		case "annot-count":
			if b.Count == nil || *b.Count < 300 {
				t.Errorf("--session %s: entry block %+v, want a count of at least 300", name, b)
			}
			if rep.Blocks[1].Count != nil || rep.Blocks[1].Refused != "no probe of the session here" {
				t.Errorf("--session %s: block 1 %+v, want no probe of the session", name, rep.Blocks[1])
			}
		case "annot-cover":
			if b.Covered == nil || !*b.Covered {
				t.Errorf("--session %s: entry block %+v, want covered", name, b)
			}
		}
	}
	if after, _ := client.Sessions(ctx); len(after) != len(before) {
		t.Errorf("sessions %d before kinst annotate --session, %d after", len(before), len(after))
	}
	if _, errOut, status := hostKinstStatus(t, append([]string{"annotate", "vfs_statx", "--session", "no-such-session"}, remote...)...); status != 1 || !strings.Contains(errOut, "no session") {
		t.Errorf("--session no-such-session: status %d, %q", status, errOut)
	}
}

// deref is *p, or nil.
func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// waitArmed reports whether a session called name ("": any) is listed by
// kerninstd within a minute: kerninstd lists a session once its probes
// are armed.
func waitArmed(ctx context.Context, name string) bool {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		list, err := client.Sessions(ctx)
		if err == nil {
			for _, s := range list {
				if s.Name == name || name == "" {
					return true
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// Source lines as points, on the host against the guest's kerninstd with
// Debian's debug vmlinux: kinst lines vfs_statx lists lines whose places
// addr2line confirms at their link-time addresses; kinst count on a line
// of vfs_statx's entry block, beside a counter at vfs_statx's entry,
// counts exactly as often while a stat loop runs (the block runs once a
// call), and the row is named by the line.
func TestSourceLinePoints(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	vmlinux := live.DebugVmlinux(t)
	slide := kaslrSlide(t, ctx, vmlinux)
	remote := []string{"--addr", guest.KerninstdAddr(), "--token-file", guest.TokenFile(), "--vmlinux", vmlinux}
	out, _ := hostKinst(t, append([]string{"lines", "vfs_statx", "--json"}, remote...)...)
	var rep output.LinesReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Lines) < 5 {
		t.Fatalf("kinst lines vfs_statx: %v, %d lines\n%.2000s", err, len(rep.Lines), out)
	}
	var addrs []uint64
	for _, l := range rep.Lines {
		addrs = append(addrs, uint64(rep.Address)+l.Offset-slide)
	}
	for i, w := range debuginfotest.Addr2line(t, vmlinux, addrs) {
		if got := fmt.Sprintf("%s:%d", rep.Lines[i].File, rep.Lines[i].Line); got != w {
			t.Errorf("%s: %s, addr2line %s", rep.Lines[i].Point, got, w)
		}
	}
	// vfs_statx's declaration, which FUNC:+N counts from (perf probe's
	// relative lines).
	i := strings.LastIndexByte(rep.Declared, ':')
	decl, err := strconv.Atoi(rep.Declared[i+1:])
	if i < 0 || err != nil || !strings.HasSuffix(rep.Declared[:i], "fs/stat.c") {
		t.Fatalf("vfs_statx declared at %q; want a line of fs/stat.c", rep.Declared)
	}
	// A line of vfs_statx's own (after its declaration: lines before it
	// are of helpers inlined into it) that starts in the entry block,
	// past the entry instruction, and takes a probe.
	cfg, err := client.CFG(ctx, "vfs_statx")
	if err != nil {
		t.Fatal(err)
	}
	entryEnd := uint64(0)
	for _, in := range cfg.Blocks[0].Instructions {
		entryEnd = max(entryEnd, in.Offset+uint64(in.Length))
	}
	var pick *output.SourceLine
	for i, l := range rep.Lines {
		if strings.HasSuffix(l.File, "fs/stat.c") && l.Line > decl && l.Offset > 0 && l.Offset < entryEnd && l.Refused == "" {
			pick = &rep.Lines[i]
			break
		}
	}
	if pick == nil {
		t.Fatalf("no line of vfs_statx's own starts in its entry block [0, %#x) and takes a probe: %+v", entryEnd, rep.Lines)
	}
	point := fmt.Sprintf("fs/stat.c:%d", pick.Line)
	t.Logf("%s (vfs_statx declared at line %d) starts at %s (%s)", point, decl, pick.Point, pick.SpliceClass)
	relative := fmt.Sprintf("vfs_statx:+%d", pick.Line-decl)

	out, stderr := hostUnderStats(t, ctx, "linecount", append([]string{"count", "vfs_statx", point, relative, "--duration", "6s", "--json", "--name", "linecount"}, remote...)...)
	var crep output.CountReport
	if err := json.Unmarshal([]byte(out), &crep); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", stderr)
	var entry, line, rel *output.CountProbe
	for i, p := range crep.Probes {
		switch {
		case p.Point == "vfs_statx":
			entry = &crep.Probes[i]
		case p.Point == point && p.Function == "vfs_statx":
			line = &crep.Probes[i]
		case p.Point == relative:
			if rel != nil || p.Function != "vfs_statx" {
				t.Errorf("%s: probe %+v, want one, in vfs_statx", relative, p)
			}
			rel = &crep.Probes[i]
		case p.Point != point:
			t.Errorf("probe %+v: no point asked", p)
		}
	}
	if entry == nil || line == nil || rel == nil {
		t.Fatalf("probes %+v: want vfs_statx, %s (in vfs_statx) and %s", crep.Probes, point, relative)
	}
	for _, p := range []*output.CountProbe{line, rel} {
		if p.Offset != pick.Offset {
			t.Errorf("%s counted at vfs_statx+%#x, kinst lines says +%#x", p.Point, p.Offset, pick.Offset)
		}
		if entry.Count < 300 || p.Count != entry.Count {
			t.Errorf("vfs_statx entry counted %d, %s %d: want equal and at least 300 (the stat loop)", entry.Count, p.Point, p.Count)
		}
	}
	// kinst annotate vfs_statx: the entry block counts the stat loop; the
	// instructions carry lines that addr2line confirms.
	out, _ = hostUnderStats(t, ctx, "", append([]string{"annotate", "vfs_statx", "--duration", "6s", "--json"}, remote...)...)
	var arep output.AnnotateReport
	if err := json.Unmarshal([]byte(out), &arep); err != nil || len(arep.Blocks) == 0 {
		t.Fatalf("kinst annotate --json: %v\n%.2000s", err, out)
	}
	if b := arep.Blocks[0]; b.Count == nil || *b.Count < 300 {
		t.Errorf("kinst annotate vfs_statx: entry block %+v, want a count of at least 300", b)
	}
	var aaddrs []uint64
	var alines []string
	for _, b := range arep.Blocks {
		for _, in := range b.Instructions {
			if in.Line != "" {
				aaddrs, alines = append(aaddrs, uint64(arep.Address)+in.Offset-slide), append(alines, in.Line)
			}
		}
	}
	if len(aaddrs) == 0 {
		t.Fatal("kinst annotate: no instruction has a line")
	}
	for i, w := range debuginfotest.Addr2line(t, vmlinux, aaddrs) {
		if alines[i] != w {
			t.Errorf("kinst annotate: %#x at %s, addr2line %s", aaddrs[i], alines[i], w)
		}
	}
	t.Logf("kinst annotate vfs_statx: %d blocks, entry counted %d, %d instructions with lines", len(arep.Blocks), *arep.Blocks[0].Count, len(aaddrs))
	annotateSessions(t, ctx, remote)

	// kinst cover --file fs/stat.c --lines L-L+3: vfs_statx among the
	// functions holding those lines, only blocks of those lines reported,
	// and the one of the line picked above covered by the stat loop.
	rng := fmt.Sprintf("%d-%d", pick.Line, pick.Line+3)
	out, _ = hostUnderStats(t, ctx, "linecover", append([]string{"cover", "--file", "fs/stat.c", "--lines", rng, "--duration", "6s", "--json", "--name", "linecover"}, remote...)...)
	var lrep api.CoverReport
	if err := json.Unmarshal([]byte(out), &lrep); err != nil {
		t.Fatalf("kinst cover --lines: %v\n%.2000s", err, out)
	}
	inRange := func(l string) bool {
		i := strings.LastIndexByte(l, ':')
		n, err := strconv.Atoi(l[i+1:])
		return err == nil && strings.HasSuffix(l[:i], "fs/stat.c") && n >= pick.Line && n <= pick.Line+3
	}
	var statx *api.CoverFunction
	for i, f := range lrep.Functions {
		if f.Function == "vfs_statx" {
			statx = &lrep.Functions[i]
		}
		for _, b := range f.Blocks {
			if !slices.ContainsFunc(b.Lines, inRange) {
				t.Errorf("kinst cover --lines %s: %s block %d has lines %v, none in the range", rng, f.Function, b.Index, b.Lines)
			}
		}
	}
	if statx == nil || !slices.ContainsFunc(statx.Blocks, func(b api.CoverBlock) bool {
		return b.Covered && uint64(b.Start) <= uint64(statx.Address)+pick.Offset && uint64(statx.Address)+pick.Offset < uint64(b.End)
	}) {
		t.Errorf("kinst cover --lines %s: vfs_statx %+v, want the block of %s (+%#x) covered", rng, statx, point, pick.Offset)
	}
	t.Logf("kinst cover --file fs/stat.c --lines %s: %d functions, %d of %d blocks covered", rng, lrep.FunctionCount, lrep.CoveredBlocks, lrep.TotalBlocks)

	// A line without code, and a file no line table names: refused, and
	// nothing installed.
	for _, bad := range []string{"fs/stat.c:1", "fs/no_such_file.c:10"} {
		cmd := exec.Command(filepath.Join(live.Bin, "kinst"), append([]string{"count", bad, "--duration", "1s"}, remote...)...)
		var eb bytes.Buffer
		cmd.Stderr = &eb
		if err := cmd.Run(); err == nil {
			t.Errorf("kinst count %s succeeded", bad)
		}
		t.Logf("kinst count %s: %s", bad, strings.TrimSpace(eb.String()))
	}
	if info, err := client.Info(ctx); err != nil || info.Splices != 0 || info.Sessions != 0 {
		t.Errorf("after the line counts: %+v, %v", info, err)
	}
}

// hostUnderStats runs kinst on the host with args (against the guest's
// kerninstd: the caller gives --addr), runs the guest's 300-stat loop
// once kerninstd lists the session named name ("": any), and returns
// kinst's stdout and stderr. A session never listed, or kinst failing,
// fails the test.
func hostUnderStats(t *testing.T, ctx context.Context, name string, args ...string) (string, string) {
	t.Helper()
	return hostUnder(t, ctx, name, "kinst workload stat 300 / >/dev/null 2>&1", args...)
}

// hostUnder is hostUnderStats with the guest's workload a shell script.
func hostUnder(t *testing.T, ctx context.Context, name, workload string, args ...string) (string, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(live.Bin, "kinst"), args...)
	var outb, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outb, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	armed := waitArmed(ctx, name)
	if armed {
		gsh(t, ctx, workload)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kinst %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	if !armed {
		t.Fatalf("kinst %s: session %q never listed\n%s", strings.Join(args, " "), name, errb.String())
	}
	return outb.String(), errb.String()
}
