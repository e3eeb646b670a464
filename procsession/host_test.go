package procsession

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo/debuginfotest"
	"github.com/kinst/kinst/procsession/proctest"
)

// textOf reads a function's bytes through /proc/PID/mem.
func textOf(t *testing.T, pid int, addr api.Addr, n uint64) []byte {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(addr)); err != nil {
		t.Fatal(err)
	}
	return b
}

// A process's sessions through the API types kerninstd serves: a counter
// counts exactly the program's calls, a timer its calls, coverage marks
// the blocks that ran; removing each puts every byte back; bad requests
// change nothing; Close leaves the program running, unspliced.
func TestHost(t *testing.T) {
	p := proctest.Start(t)
	h, err := Open(p.Cmd.Process.Pid, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx := context.Background()
	info, _ := h.Info(ctx)
	if info.Mechanism != "process" || !strings.Contains(info.Target, fmt.Sprint(p.Cmd.Process.Pid)) {
		t.Errorf("info %+v", info)
	}
	fns, _ := h.Functions(ctx, "work", 10)
	if len(fns.Functions) == 0 || fns.Functions[0].Name != "work" {
		t.Errorf("functions: %+v", fns)
	}
	// A library's function is named LIB:NAME, and that name opens it.
	lib := ""
	if fns, _ := h.Functions(ctx, "malloc", 50); true {
		for _, f := range fns.Functions {
			if strings.HasSuffix(f.Name, ":malloc") && f.Module != "" {
				lib = f.Name
			}
		}
	}
	if lib == "" {
		t.Fatalf("malloc of a library not found as LIB:malloc")
	}
	if g, err := h.CFG(ctx, lib); err != nil || g.Function != lib || len(g.Blocks) == 0 {
		t.Errorf("CFG(%s): %s, %d blocks, %v", lib, g.Function, len(g.Blocks), err)
	}
	if fns, _ := h.Functions(ctx, strings.TrimSuffix(lib, "malloc")+"*alloc", 50); fns.Total == 0 {
		t.Errorf("LIB:GLOB found nothing")
	}
	for _, limit := range []int{0, -5, MaxFunctions + 1} {
		var br *BadRequestError
		if _, err := h.Functions(ctx, "work", limit); !errors.As(err, &br) {
			t.Errorf("limit %d: %v, want a bad request", limit, err)
		}
	}
	cfg, err := h.CFG(ctx, "work")
	if err != nil {
		t.Fatal(err)
	}
	orig := textOf(t, p.Cmd.Process.Pid, cfg.Address, cfg.Size)

	for _, req := range []api.SessionRequest{
		{Points: []string{"no_such_function"}},
		{Points: []string{"work+0x1"}},
		{Points: []string{"work"}, Virtual: true},
		{Cover: []string{"work"}, Points: []string{"work"}},
		{CoverModules: []string{"ext4"}},
		{},
	} {
		_, err := h.CreateSession(ctx, req)
		var br *BadRequestError
		if !errors.As(err, &br) {
			t.Errorf("%+v: %v, want a bad request", req, err)
		}
	}
	if ss, _ := h.Sessions(ctx); len(ss) != 0 {
		t.Fatalf("bad requests left %+v", ss)
	}

	_, err = h.CreateSession(ctx, api.SessionRequest{Points: []string{"work", "work:0"}, Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	timed, err := h.CreateSession(ctx, api.SessionRequest{Timers: []string{"mix"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.CreateSession(ctx, api.SessionRequest{Points: []string{"work"}, Name: "c"}); err == nil {
		t.Errorf("a second session named c")
	}
	p.Round(t)
	ss, err := h.Sessions(ctx)
	if err != nil || len(ss) != 2 {
		t.Fatalf("sessions %+v %v", ss, err)
	}
	for _, pr := range ss[0].Probes {
		if pr.Count != proctest.CallsPerRound || pr.Function != "work" {
			t.Errorf("probe %s: %d calls of %s, the program made %d", pr.Point, pr.Count, pr.Function, proctest.CallsPerRound)
		}
	}
	if tm := ss[1].Timers; len(tm) != 1 || tm[0].Calls != proctest.CallsPerRound || tm[0].WallNS <= 0 {
		t.Errorf("timer %+v, want %d calls", tm, proctest.CallsPerRound)
	}
	for _, id := range []string{"c", timed.ID} {
		if _, err := h.RemoveSession(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.RemoveSession(ctx, "c"); !errors.Is(err, ErrNoSession) {
		t.Errorf("removing a removed session: %v", err)
	}
	if now := textOf(t, p.Cmd.Process.Pid, cfg.Address, cfg.Size); string(now) != string(orig) {
		t.Errorf("work's bytes differ after removal")
	}

	cov, err := h.CreateSession(ctx, api.SessionRequest{Cover: []string{"work", "mix"}})
	if err != nil {
		t.Fatal(err)
	}
	if cov.Cover == nil || cov.Cover.Armed == 0 {
		t.Fatalf("coverage armed nothing: %+v", cov.Cover)
	}
	p.Round(t)
	h.mu.Lock()
	for _, s := range h.sessions {
		s.cover.Sweep(h.tg, s.created)
	}
	h.mu.Unlock()
	rep, err := h.CoverReport(ctx, cov.ID)
	if err != nil {
		t.Fatal(err)
	}
	if rep.CoveredBlocks == 0 || len(rep.Functions) != 2 {
		t.Errorf("coverage after a round: %d of %d blocks covered, %d functions", rep.CoveredBlocks, rep.TotalBlocks, len(rep.Functions))
	}
	if _, err := h.CoverReport(ctx, "nope"); !errors.Is(err, ErrNoSession) {
		t.Errorf("report of no session: %v", err)
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if now := textOf(t, p.Cmd.Process.Pid, cfg.Address, cfg.Size); string(now) != string(orig) {
		t.Errorf("work's bytes differ after Close")
	}
	p.Round(t) // still runs, unspliced
}

// Source lines of the executable's functions, from its DWARF: each
// instruction's line is addr2line's at its link-time address (the
// function's offset added to its symbol's value, from nm).
func TestLines(t *testing.T) {
	p := proctest.Start(t)
	h, err := Open(p.Cmd.Process.Pid, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	cfg, err := h.CFG(context.Background(), "mix")
	if err != nil {
		t.Fatal(err)
	}
	h.Lines(&cfg)
	out, err := exec.Command("nm", p.Bin).Output()
	if err != nil {
		t.Skipf("nm: %v", err)
	}
	var sym uint64
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[2] == "mix" {
			sym, _ = strconv.ParseUint(f[0], 16, 64)
		}
	}
	var addrs []uint64
	var got []string
	for _, b := range cfg.Blocks {
		for _, in := range b.Instructions {
			if in.Line != "" {
				addrs = append(addrs, sym+in.Offset)
				got = append(got, in.Line)
			}
		}
	}
	if len(addrs) == 0 {
		t.Fatal("no instruction of mix has a source line")
	}
	want := debuginfotest.Addr2line(t, p.Bin, addrs)
	for i := range addrs {
		if got[i] != want[i] {
			t.Errorf("mix at %#x: line %s, addr2line %s", addrs[i], got[i], want[i])
		}
	}
}

// A session's samples stream its totals as kerninstd's do; a point in a
// library the process has not loaded waits for it (mechanism "none")
// while the others count; the stream ends when the process exits, and
// the session's last counts are still there to remove.
func TestSamples(t *testing.T) {
	p := proctest.Start(t)
	var log strings.Builder
	h, err := Open(p.Cmd.Process.Pid, Options{Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ctx := context.Background()
	sess, err := h.CreateSession(ctx, api.SessionRequest{Points: []string{"work", "libm:cbrt", "libnosuchthing:f"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sess.Probes) != 3 || sess.Probes[0].Mechanism != "splice" || sess.Probes[1].Mechanism != "none" || sess.Probes[1].Point != "libm:cbrt" {
		t.Fatalf("probes %+v, want work spliced and libm:cbrt waiting", sess.Probes)
	}
	// libm is installed, so it waits without a word more; a library no
	// directory holds is most likely misspelt, and that is said.
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		switch {
		case strings.Contains(l, "libm:cbrt: the library is not loaded yet"):
			if strings.Contains(l, "warning") {
				t.Errorf("libm is installed: %q", l)
			}
		case strings.Contains(l, "libnosuchthing:f: the library is not loaded yet"):
			if !strings.Contains(l, `no library "libnosuchthing" is in the library directories`) {
				t.Errorf("a library no directory holds: %q", l)
			}
		default:
			t.Errorf("said %q", l)
		}
	}
	if n := strings.Count(log.String(), "not loaded yet"); n != 2 {
		t.Errorf("the waits are not said: %q", log.String())
	}
	st, err := h.Samples(ctx, sess.ID, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if _, err := h.Samples(ctx, "nope", time.Second); !errors.Is(err, ErrNoSession) {
		t.Errorf("samples of no session: %v", err)
	}
	p.Round(t)
	var total, deltas uint64
	for total < proctest.CallsPerRound {
		s, err := st.Next()
		if err != nil {
			t.Fatalf("next: %v", err)
		}
		if len(s.Totals) != 3 || len(s.Deltas) != 3 || s.Totals[1] != 0 || s.Totals[2] != 0 {
			t.Fatalf("sample %+v", s)
		}
		total, deltas = s.Totals[0], deltas+s.Deltas[0]
	}
	if total != proctest.CallsPerRound || deltas != total {
		t.Errorf("work: total %d, deltas summing to %d; want %d both", total, deltas, proctest.CallsPerRound)
	}
	p.Cmd.Process.Kill()
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := st.Next(); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != io.EOF {
			t.Errorf("the stream ended with %v, want io.EOF", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream did not end when the process did")
	}
	if e := h.Ended(); e != "exited" {
		t.Errorf("ended %q, want exited", e)
	}
	final, err := h.RemoveSession(ctx, sess.ID)
	if err != nil || final.Probes[0].Count != proctest.CallsPerRound {
		t.Errorf("final %+v, %v; want work's last count %d", final.Probes, err, proctest.CallsPerRound)
	}
}
