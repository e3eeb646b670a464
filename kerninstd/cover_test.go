package kerninstd

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/engine/enginetest"
)

// waitCovered waits (real time: the test daemon's clock is the system's)
// until the session reports n covered blocks.
func waitCovered(t *testing.T, d *Daemon, id string, n int) api.CoverReport {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d.mu.Lock()
		ss := d.sessions[id]
		rep := ss.cover.report(ss.name, d.clock.Now())
		d.mu.Unlock()
		if rep.CoveredBlocks >= n || time.Now().After(deadline) {
			if rep.CoveredBlocks != n {
				t.Fatalf("%d blocks covered, want %d", rep.CoveredBlocks, n)
			}
			return *rep
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A coverage session: a probe per block at the block's cheapest
// spliceable instruction, refused blocks with their reason; a probe that
// runs is seen and removed (its bytes back) while the others stay; the
// session's end removes the rest and every byte is back.
func TestCoverSession(t *testing.T) {
	d, k := newTestDaemon(t)
	// Every block probed: pruning's tests are package cover's.
	s, err := d.CreateSession(api.SessionRequest{Cover: []string{"filename_*"}, CoverAllBlocks: true, Name: "cov"})
	if err != nil {
		t.Fatal(err)
	}
	// The session's description carries the totals; its report, every block.
	sum := s.Cover
	rep, err := d.CoverReport("cov")
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Functions) != 1 || rep.Functions[0].Function != "filename_lookup" {
		t.Fatalf("cover = %+v; want filename_lookup alone", rep)
	}
	if sum == nil || sum.Functions != nil || sum.FunctionCount != 1 || sum.TotalBlocks != rep.TotalBlocks || sum.Armed != rep.Armed ||
		sum.RefusedBlocks != rep.Functions[0].Refused {
		t.Fatalf("summary %+v, report totals %d blocks, %d armed", sum, rep.TotalBlocks, rep.Armed)
	}
	if _, err := d.CoverReport("nope"); !errors.Is(err, ErrNoSession) {
		t.Errorf("CoverReport of no session: %v", err)
	}
	f := rep.Functions[0]
	for _, b := range f.Blocks {
		t.Logf("block %d at %#x: point %v refused %v", b.Index, uint64(b.Start), str(b.Point), str(b.Refused))
	}
	if f.Total < 3 || f.Total != len(f.Blocks) || rep.TotalBlocks != f.Total || rep.Armed+f.Refused != f.Total {
		t.Fatalf("function %+v, armed %d", f, rep.Armed)
	}
	var probed []api.CoverBlock
	for _, b := range f.Blocks {
		if (b.Point == nil) == (b.Refused == nil) {
			t.Errorf("block %d: point %v, refused %v; want exactly one", b.Index, b.Point, b.Refused)
		}
		if b.Covered || b.Lines == nil {
			t.Errorf("block %d: covered %v, lines %v", b.Index, b.Covered, b.Lines)
		}
		if b.Point != nil {
			probed = append(probed, b)
		}
	}
	// Block 0's probe is at +0xb: the ftrace site and the short prologue
	// instructions are dearer than the 7-byte load (direct).
	if f.Blocks[0].Point == nil || *f.Blocks[0].Point != "filename_lookup+0xb" {
		t.Errorf("block 0 probed at %v, want filename_lookup+0xb", f.Blocks[0].Point)
	}
	if in := d.Info(); in.Splices != rep.Armed || rep.Armed < 2 {
		t.Fatalf("%d splices for %d probes", in.Splices, rep.Armed)
	}
	if len(rep.Timeline) != 1 || rep.Timeline[0].LiveProbes != rep.Armed {
		t.Errorf("timeline %+v", rep.Timeline)
	}

	// Block 0 runs (twice): covered, its probe removed, its bytes back.
	for range 2 {
		if err := k.Count(textAddr+0xb, 1); err != nil {
			t.Fatal(err)
		}
	}
	got := waitCovered(t, d, s.ID, 1)
	if !got.Functions[0].Blocks[0].Covered || got.Removed != 1 {
		t.Errorf("after block 0 ran: %+v", got)
	}
	if !bytes.Equal(textNow(t, k)[0xb:0x12], text[0xb:0x12]) {
		t.Error("block 0's probe still spliced")
	}
	if in := d.Info(); in.Splices != rep.Armed-1 {
		t.Errorf("%d splices, want %d", in.Splices, rep.Armed-1)
	}
	last := got.Timeline[len(got.Timeline)-1]
	if len(got.Timeline) != 2 || last.LiveProbes != rep.Armed-1 || last.Covered != 1 {
		t.Errorf("timeline %+v", got.Timeline)
	}

	// The last probed block runs just before the end: counted whether
	// the poller or the final sweep sees it.
	lastProbe := probed[len(probed)-1]
	d.mu.Lock()
	var at uint64
	for _, p := range d.sessions[s.ID].cover.set.Live() {
		if f.Blocks[p.Block].Index == lastProbe.Index {
			at = d.eng.Installed(p.Request).Site.Addr()
		}
	}
	d.mu.Unlock()
	if err := k.Count(at, 1); err != nil {
		t.Fatal(err)
	}
	final, err := d.RemoveSession("cov")
	if err != nil {
		t.Fatal(err)
	}
	fr := final.Cover
	lastCovered := false
	for _, b := range fr.Functions[0].Blocks {
		lastCovered = lastCovered || b.Index == lastProbe.Index && b.Covered
	}
	if fr.CoveredBlocks != 2 || fr.Removed != 2 || !lastCovered {
		t.Errorf("final: covered %d, removed %d: %+v", fr.CoveredBlocks, fr.Removed, fr.Functions[0].Blocks)
	}
	if fr.Functions[0].Covered != 2 || fr.Session != "cov" {
		t.Errorf("final function %+v, session %q", fr.Functions[0], fr.Session)
	}
	if !bytes.Equal(textNow(t, k), text) {
		t.Error("text not restored")
	}
	d.eng.Reclaim()
	if st := d.eng.State(); st.Splices != 0 || st.Counters != 0 || st.Retired != 0 {
		t.Errorf("left: %+v", st)
	}
	if _, err := d.RemoveSession("cov"); !errors.Is(err, ErrNoSession) {
		t.Errorf("removed twice: %v", err)
	}
}

// Bad coverage requests change nothing.
func TestCoverRefusals(t *testing.T) {
	d, k := newTestDaemon(t)
	for _, req := range []api.SessionRequest{
		{Cover: []string{"no_such_function"}},
		{Cover: []string{"zz_*"}},
		{Cover: []string{"[bad"}},
		{Cover: []string{"filename_lookup"}, Points: []string{"filename_lookup"}},
		{Cover: []string{"filename_lookup"}, Filter: &api.Filter{PID: 1, Comm: "x"}},
	} {
		if _, err := d.CreateSession(req); err == nil {
			t.Errorf("%+v accepted", req)
		}
	}
	if in := d.Info(); in.Splices != 0 || in.Sessions != 0 || !bytes.Equal(textNow(t, k), text) {
		t.Errorf("a refused request changed something: %+v", in)
	}
}

func str(p *string) string {
	if p == nil {
		return "null"
	}
	return *p
}

// A coverage request with more probes than the driver holds is refused
// as it is planned, naming the bound, and changes nothing.
func TestCoverTooManyProbes(t *testing.T) {
	k, path, err := enginetest.Fixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Device: k, Kallsyms: path, Release: "test", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Info: func() api.Info { return api.Info{MaxSplices: 2} }})
	if err != nil {
		t.Fatal(err)
	}
	before := textNow(t, k)
	_, err = d.CreateSession(api.SessionRequest{Cover: []string{"filename_*"}, CoverAllBlocks: true})
	if !errors.Is(err, ErrTooManyProbes) || !strings.Contains(err.Error(), "driver holds 2 splices") {
		t.Fatalf("3+ probes, room for 2: %v", err)
	}
	if !bytes.Equal(textNow(t, k), before) || len(d.sessions) != 0 {
		t.Error("a refused coverage request changed something")
	}
}
