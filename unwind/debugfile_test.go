package unwind

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/internal/elfsym"
)

// libcDebugFile is the separate debug file of the installed libc, by
// its build id (Debian's libc6-dbg), or the test skips.
func libcDebugFile(t *testing.T) (libc, debug string) {
	t.Helper()
	libc = existing(t, "/lib/x86_64-linux-gnu/libc.so.6")
	ef, err := elfsym.OpenFile(libc)
	if err != nil {
		t.Fatal(err)
	}
	id, err := elfsym.BuildID(ef)
	ef.Close()
	if err != nil {
		t.Fatal(err)
	}
	debug = filepath.Join("/usr/lib/debug/.build-id", id[:2], id[2:]+".debug")
	if _, err := os.Stat(debug); err != nil {
		t.Skipf("libc's debug file %s: %v (apt-get install libc6-dbg)", debug, err)
	}
	return libc, debug
}

// TestLibcInternalFrameNamedByDebugPackage: a thread blocked in
// pthread_join waits in a static function of the stripped libc. Without
// its debug file the frame is only libc.so.6+offset; with Debian's
// libc6-dbg (found by build id) it is named as gdb names it (gdb reads
// the same debug file), with the source line addr2line gives.
func TestLibcInternalFrameNamedByDebugPackage(t *testing.T) {
	libc, debug := libcDebugFile(t)
	bin := buildCFile(t, "testdata/joiner.c", "-pthread")
	pid := startReady(t, bin).Process.Pid
	waitSyscall(t, pid, unix.SYS_FUTEX)

	unwindWith := func(c *Cache) (*Process, []uint64) {
		p, err := c.Process(pid)
		if err != nil {
			t.Fatal(err)
		}
		regs, _, err := SyscallRegs(pid, pid)
		if err != nil {
			t.Fatal(err)
		}
		return p, p.Unwind(regs, 0)
	}

	// Without debug files (an empty root): unnamed libc frames.
	bare := NewCache()
	bare.Debug = &DebugSearch{Root: t.TempDir()}
	p0, pcs := unwindWith(bare)
	var unnamed []int
	for i, pc := range pcs {
		s, ok := p0.Symbolize(callerAt(i, pc))
		if ok && s.Name == "" && filepath.Base(s.File) == "libc.so.6" {
			unnamed = append(unnamed, i)
		}
	}
	t.Logf("without debug files: %v", names(p0, pcs))
	if len(unnamed) == 0 {
		t.Fatalf("no unnamed libc frame in %v: nothing for the debug file to name", names(p0, pcs))
	}
	if notes := p0.DebugNotes(); !strings.Contains(fmt.Sprint(notes), "libc.so.6:no separate debug file; tried") {
		t.Errorf("notes without debug files: %v", notes)
	}

	c := NewCache()
	c.Debug = &DebugSearch{} // local paths only, whatever DEBUGINFOD_URLS says
	p, pcs2 := unwindWith(c)
	if !equalU64(pcs, pcs2) {
		t.Fatalf("stacks differ: %#x and %#x", pcs, pcs2)
	}
	for _, i := range unnamed {
		at := callerAt(i, pcs[i])
		s, _ := p.Symbolize(at)
		m := p.mapping(at)
		addr := at - m.bias
		want := gdbInfoSymbol(t, libc, addr)
		t.Logf("frame %d: libc.so.6+%#x is %s+%#x (gdb: %s)", i, addr, s.Name, s.Offset, want)
		if want != "" && fmt.Sprintf("%s+%d", s.Name, s.Offset) != want {
			t.Errorf("frame %d at libc+%#x: named %s+%d, gdb says %s", i, addr, s.Name, s.Offset, want)
		}
		if s.Name == "" {
			t.Errorf("frame %d at libc+%#x still unnamed", i, addr)
		}
		d := m.file.Debug(m.Path)
		if d.Path != debug || d.Via != "build-id" {
			t.Errorf("debug file %s via %s, want %s via build-id", d.Path, d.Via, debug)
		}
		line, ok := p.SourceLine(at)
		if file, n := gdbInfoLine(t, libc, addr); file != "" {
			// gdb prints the name relative to the unit's directory.
			rel := strings.TrimLeft(filepath.Clean(file), "./")
			if !ok || line.Line != n || !strings.HasSuffix(filepath.Clean(line.File), rel) {
				t.Errorf("frame %d: line %v (%v), gdb says %s:%d", i, line, ok, file, n)
			}
		}
	}
}

func equalU64(a, b []uint64) bool {
	return fmt.Sprint(a) == fmt.Sprint(b)
}

// gdbInfoSymbol is gdb's "info symbol" of a link-time address of file as
// "name+decimal offset", "" without gdb.
func gdbInfoSymbol(t *testing.T, file string, addr uint64) string {
	t.Helper()
	if _, err := exec.LookPath("gdb"); err != nil {
		t.Log("no gdb: names not compared with gdb's")
		return ""
	}
	out, err := exec.Command("gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off",
		"-ex", fmt.Sprintf("info symbol %#x", addr), file).CombinedOutput()
	if err != nil {
		t.Fatalf("gdb: %v\n%s", err, out)
	}
	// "__futex_abstimed_wait_common + 198 in section .text"
	for _, line := range strings.Split(string(out), "\n") {
		if name, rest, ok := strings.Cut(line, " + "); ok && strings.Contains(rest, " in section ") {
			off, _, _ := strings.Cut(rest, " ")
			return name + "+" + off
		}
		if name, ok := strings.CutSuffix(line, " in section .text"); ok {
			return name + "+0"
		}
	}
	t.Fatalf("gdb info symbol %#x: %s", addr, out)
	return ""
}

// gdbInfoLine is the file and line gdb's "info line *ADDR" gives for a
// link-time address of file ("" without gdb). binutils 2.40's addr2line
// is not the oracle here: it names the wrong file for some of libc's
// DWARF 5 rows (libc-start.c for lines of libc_start_call_main.h), where
// gdb and llvm-addr2line agree.
func gdbInfoLine(t *testing.T, file string, addr uint64) (string, int) {
	t.Helper()
	if _, err := exec.LookPath("gdb"); err != nil {
		t.Log("no gdb: lines not compared with gdb's")
		return "", 0
	}
	out, err := exec.Command("gdb", "-batch", "-nx", "-iex", "set debuginfod enabled off",
		"-ex", fmt.Sprintf("info line *%#x", addr), file).CombinedOutput()
	if err != nil {
		t.Fatalf("gdb: %v\n%s", err, out)
	}
	// Line 58 of "../sysdeps/nptl/libc_start_call_main.h" starts at …
	for _, line := range strings.Split(string(out), "\n") {
		var n int
		var name string
		if _, err := fmt.Sscanf(line, "Line %d of %q", &n, &name); err == nil {
			return name, n
		}
	}
	t.Fatalf("gdb info line *%#x: %s", addr, out)
	return "", 0
}

// addr2line is `addr2line -e file addr`, "" for "??:0" or "??:?".
func addr2line(t *testing.T, file string, addr uint64) string {
	t.Helper()
	out, err := exec.Command("addr2line", "-e", file, fmt.Sprintf("%#x", addr)).Output()
	if err != nil {
		t.Fatalf("addr2line: %v", err)
	}
	s := strings.TrimSpace(string(out))
	if i := strings.Index(s, " (discriminator"); i >= 0 {
		s = s[:i]
	}
	if strings.HasPrefix(s, "??:") || strings.HasSuffix(s, ":0") || strings.HasSuffix(s, ":?") {
		return ""
	}
	return s
}

// splitDebug builds testdata/blocker.c with -g and splits it as Debian's
// packaging does: the debug file (objcopy --only-keep-debug) and the
// binary stripped of everything but .dynsym, with a .gnu_debuglink to
// the debug file when link is set. It returns the binary, the debug file
// and the unstripped binary.
func splitDebug(t *testing.T, link bool) (bin, debug, full string) {
	return splitDebugFile(t, link, false)
}

// splitDebugFile is splitDebug; noSymtab also takes the symbol table out
// of the debug file, leaving the DWARF alone to name functions.
func splitDebugFile(t *testing.T, link, noSymtab bool) (bin, debug, full string) {
	t.Helper()
	for _, tool := range []string{"objcopy", "strip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
	full = buildC(t, "-g", "-fomit-frame-pointer", "-Wl,--build-id")
	dir := t.TempDir()
	bin, debug = filepath.Join(dir, "blocker"), filepath.Join(dir, "blocker.debug")
	run := func(name string, args ...string) {
		if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
	}
	run("objcopy", "--only-keep-debug", full, debug)
	if noSymtab {
		run("objcopy", "--strip-all", "--keep-section=.debug_*", debug)
	}
	run("strip", "--strip-all", "-o", bin, full)
	if link {
		run("objcopy", "--add-gnu-debuglink="+debug, bin)
	}
	return bin, debug, full
}

// nmAddr is the address nm gives a symbol of file.
func nmAddr(t *testing.T, file, name string) uint64 {
	t.Helper()
	out, err := exec.Command("nm", file).Output()
	if err != nil {
		t.Fatalf("nm %s: %v", file, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[2] == name {
			v, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("nm %s: no %s", file, name)
	return 0
}

// TestDebuglinkNamesStrippedBinary: a stripped binary blocked in
// level3 ← level2 ← level1 ← main unwinds to those names through the
// .gnu_debuglink file next to it, with the source lines addr2line reads
// in the unstripped binary; a debug file whose CRC does not match is
// refused, and the note says so.
func TestDebuglinkNamesStrippedBinary(t *testing.T) {
	bin, debug, full := splitDebug(t, true)
	pid := startBlocker(t, bin)
	c := NewCache()
	c.Debug = &DebugSearch{}
	p, err := c.Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	regs, _, err := SyscallRegs(pid, pid)
	if err != nil {
		t.Fatal(err)
	}
	pcs := p.Unwind(regs, 0)
	frames := names(p, pcs)
	t.Logf("stack: %v", frames)
	if !hasChain(frames) {
		t.Fatalf("stack %q lacks level3 level2 level1 main", frames)
	}
	for i, pc := range pcs {
		m := p.mapping(pc)
		if m == nil || m.Path != bin {
			continue
		}
		d := m.file.Debug(m.Path)
		if d.Via != "debuglink" || d.Path != debug {
			t.Errorf("debug file %q via %q, want %s via debuglink", d.Path, d.Via, debug)
		}
		at := callerAt(i, pc)
		line, ok := p.SourceLine(at)
		want := addr2line(t, full, at-m.bias)
		if ok != (want != "") || (ok && line.String() != want) {
			t.Errorf("frame %d (%s): line %v (%v), addr2line says %q", i, frames[i], line, ok, want)
		}
	}

	// A debug file of another build: its CRC does not match.
	b, err := os.ReadFile(debug)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(debug, append(b, 0), 0o644); err != nil {
		t.Fatal(err)
	}
	c2 := NewCache()
	c2.Debug = &DebugSearch{}
	f, err := c2.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	d := f.Debug(bin)
	if d.Symbols != nil || d.Err == nil || !strings.Contains(d.Err.Error(), "CRC") {
		t.Errorf("debug file with a wrong CRC: symbols %v, error %v; want refused for its CRC", d.Symbols != nil, d.Err)
	}
}

// TestDebuginfod serves the debug file of a stripped binary (no
// debuglink) from a local debuginfod server: it is found by build id,
// kept in the cache (a second run needs no server), and a server that
// does not answer in time or answers 404 gives an error naming it.
func TestDebuginfod(t *testing.T) {
	bin, debug, full := splitDebug(t, false)
	body, err := os.ReadFile(debug)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elfsym.OpenFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := elfsym.BuildID(ef)
	ef.Close()
	if id == "" {
		t.Fatal("no build id")
	}
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = append(asked, r.URL.Path)
		if r.URL.Path != "/buildid/"+id+"/debuginfo" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "debuginfo", time.Time{}, bytes.NewReader(body))
	}))
	defer srv.Close()
	cacheDir := t.TempDir()
	level3 := nmAddr(t, full, "level3")

	lookup := func(s *DebugSearch) *DebugInfo {
		c := NewCache()
		c.Debug = s
		f, err := c.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		if f.Symbols != nil {
			if _, _, ok := f.Symbols.Lookup(level3); ok {
				t.Fatal("the stripped binary names level3 itself")
			}
		}
		return f.Debug(bin)
	}
	d := lookup(&DebugSearch{Root: t.TempDir(), Debuginfod: []string{srv.URL + "/"}, CacheDir: cacheDir})
	if d.Err != nil || d.Via != "debuginfod" {
		t.Fatalf("debuginfod: %+v", d)
	}
	if s, off, ok := d.Symbols.Lookup(level3 + 1); !ok || s.Name != "level3" || off != 1 {
		t.Errorf("level3+1 named %v+%d (%v)", s.Name, off, ok)
	}
	if want := addr2line(t, full, level3); want != "" {
		lines, err := d.Lines()
		if err != nil {
			t.Fatal(err)
		}
		if l, err := lines.LineAt(level3); err != nil || l.String() != want {
			t.Errorf("line of level3 %v (%v), addr2line says %s", l, err, want)
		}
	}
	cached := filepath.Join(cacheDir, id, "debuginfo")
	if got, err := os.ReadFile(cached); err != nil || !bytes.Equal(got, body) {
		t.Errorf("cache file %s: %v, %d bytes, want %d", cached, err, len(got), len(body))
	}
	if len(asked) != 1 {
		t.Errorf("server asked %v, want one request", asked)
	}

	// From the cache: the server is not asked again.
	d = lookup(&DebugSearch{Root: t.TempDir(), Debuginfod: []string{srv.URL}, CacheDir: cacheDir})
	if d.Err != nil || d.Symbols == nil || len(asked) != 1 {
		t.Errorf("from the cache: %+v, server asked %v", d, asked)
	}

	// 404: the error names the server and the answer.
	empty := t.TempDir()
	d = lookup(&DebugSearch{Root: t.TempDir(), Debuginfod: []string{srv.URL + "/nothing"}, CacheDir: empty})
	if d.Symbols != nil || d.Err == nil || !strings.Contains(d.Err.Error(), "404") || !strings.Contains(d.Err.Error(), srv.URL) {
		t.Errorf("404: %v", d.Err)
	}

	// No server at all: the error names the URL once, and why.
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	d = lookup(&DebugSearch{Root: t.TempDir(), Debuginfod: []string{gone.URL}, CacheDir: empty})
	if d.Err == nil || !strings.Contains(d.Err.Error(), "debuginfod "+gone.URL+"/buildid/"+id+"/debuginfo: dial tcp") ||
		strings.Count(d.Err.Error(), gone.URL) != 1 {
		t.Errorf("no server: %v", d.Err)
	}

	// A server that never answers: the request gives up at the timeout.
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hang)
	d = lookup(&DebugSearch{Root: t.TempDir(), Debuginfod: []string{slow.URL}, CacheDir: empty, Timeout: 200 * time.Millisecond})
	if d.Symbols != nil || d.Err == nil || !strings.Contains(d.Err.Error(), "no answer within 200ms") {
		t.Errorf("silent server: %v", d.Err)
	}
	if _, err := os.Stat(filepath.Join(empty, id, "debuginfo")); err == nil {
		t.Error("a failed download left a cache file")
	}
}

func TestParseDebuglink(t *testing.T) {
	b := append([]byte("x.debug\x00"), 0, 0, 0, 0)
	b[8], b[9], b[10], b[11] = 0x78, 0x56, 0x34, 0x12
	if name, crc, ok := parseDebuglink(b); !ok || name != "x.debug" || crc != 0x12345678 {
		t.Errorf("parseDebuglink = %q %#x %v", name, crc, ok)
	}
	for _, bad := range [][]byte{nil, []byte("\x00\x00\x00\x00\x00"), []byte("abc\x00\x01")} {
		if _, _, ok := parseDebuglink(bad); ok {
			t.Errorf("parseDebuglink(%q) ok", bad)
		}
	}
}

// callerAt is the address inside the call of frame i (see Symbolize).
func callerAt(i int, pc uint64) uint64 {
	if i > 0 {
		return pc - 1
	}
	return pc
}

// TestDebugFileWithoutSymtab: a debug file without a symbol table names
// the functions of the stripped binary from its DWARF subprograms: the
// names and offsets nm and the unstripped binary give.
func TestDebugFileWithoutSymtab(t *testing.T) {
	bin, debug, full := splitDebugFile(t, true, true)
	if out, _ := exec.Command("readelf", "-S", debug).Output(); bytes.Contains(out, []byte(".symtab")) {
		t.Fatal("the debug file kept its .symtab")
	}
	pid := startBlocker(t, bin)
	c := NewCache()
	c.Debug = &DebugSearch{}
	p, err := c.Process(pid)
	if err != nil {
		t.Fatal(err)
	}
	regs, _, err := SyscallRegs(pid, pid)
	if err != nil {
		t.Fatal(err)
	}
	pcs := p.Unwind(regs, 0)
	frames := names(p, pcs)
	t.Logf("stack: %v", frames)
	if !hasChain(frames) {
		t.Fatalf("stack %q lacks level3 level2 level1 main", frames)
	}
	for i, pc := range pcs {
		m := p.mapping(pc)
		if m == nil || m.Path != bin {
			continue
		}
		at := callerAt(i, pc)
		s, _ := p.Symbolize(at)
		if s.Name == "" {
			continue // _start: assembly without DWARF
		}
		if addr := nmAddr(t, full, s.Name); addr+s.Offset != at-m.bias {
			t.Errorf("frame %d: %s+%#x, nm puts %s at %#x", i, s.Name, s.Offset, s.Name, addr)
		}
	}
}
