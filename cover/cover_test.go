package cover

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/engine/enginetest"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// fixture is an engine over enginetest's kernel (a stand-in for the
// driver: these tests check the Set's bookkeeping; the live tests run
// real probes) and a planner over it.
type fixture struct {
	k *enginetest.Kernel
	e *engine.Engine
	p *splice.Planner
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	k, path, err := enginetest.Fixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := engine.New(engine.Config{Device: k, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	p, err := enginetest.Planner(e.Text(), e.Springboards(), path)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{k: k, e: e, p: p}
}

// set plans a probe at every block of fns (none inferred: the tests of
// pruning are prune_test.go's).
func (f *fixture) set(t *testing.T, fns ...string) *Set {
	t.Helper()
	s := New("")
	s.AllBlocks()
	for _, name := range fns {
		fn, _, err := f.p.Func(name)
		if err != nil {
			t.Fatal(err)
		}
		s.Add(fn)
	}
	return s
}

// failing is an Engine whose removals of the requests in fail fail.
type failing struct {
	*engine.Engine
	fail map[*engine.Request]bool
}

func (f failing) RemoveEach(rs []*engine.Request) []error {
	errs := make([]error, len(rs))
	var ok []*engine.Request
	var at []int
	for i, r := range rs {
		if f.fail[r] {
			errs[i] = errors.New("busy")
			continue
		}
		ok, at = append(ok, r), append(at, i)
	}
	for k, err := range f.Engine.RemoveEach(ok) {
		errs[at[k]] = err
	}
	return errs
}

// TestSetLifecycle: Add plans a probe per block, Arm splices them all,
// Sweep marks and removes exactly the probes that ran, a failed removal
// is retried without counting the block twice, Remove takes the rest and
// the text is as it was.
func TestSetLifecycle(t *testing.T) {
	f := newFixture(t)
	s := f.set(t, "filename_lookup")
	clock := time.Unix(1000, 0)
	now := func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	s.Arm(f.e, "test", Flag(nil), now)
	rep := snap(s, clock)
	if rep.Armed == 0 || rep.Armed+rep.Functions[0].Refused != rep.TotalBlocks || rep.TotalBlocks != len(rep.Functions[0].Blocks) {
		t.Fatalf("armed %d, refused %d, total %d, blocks %d", rep.Armed, rep.Functions[0].Refused, rep.TotalBlocks, len(rep.Functions[0].Blocks))
	}
	if len(f.k.Splices) != rep.Armed {
		t.Fatalf("%d splices for %d probes", len(f.k.Splices), rep.Armed)
	}
	for _, b := range rep.Functions[0].Blocks {
		if (b.Point == "") == (b.Refused == "") {
			t.Errorf("block %d: point %q, refused %q: want exactly one", b.Index, b.Point, b.Refused)
		}
	}
	if failed := s.Sweep(f.e, now()); failed != nil || len(snap(s, clock).Timeline) != 1 {
		t.Fatalf("a sweep with nothing hit: %v, timeline %v", failed, snap(s, clock).Timeline)
	}

	// Two probes run; the first's removal fails once.
	live := s.Live()
	if len(live) < 2 {
		t.Fatalf("%d live probes, want at least 2", len(live))
	}
	a, b := live[0].Request, live[1].Request
	for _, r := range []*engine.Request{a, b} {
		if err := f.k.Count(r.Site().Addr(), 1); err != nil {
			t.Fatal(err)
		}
	}
	eng := failing{f.e, map[*engine.Request]bool{a: true}}
	failed := s.Sweep(eng, now())
	rep = snap(s, clock)
	if len(failed) != 1 || failed[a] == nil || rep.CoveredBlocks != 2 || rep.Removed != 1 || len(s.Live()) != len(live)-1 {
		t.Fatalf("sweep: failed %v, covered %d, removed %d, live %d (of %d)", failed, rep.CoveredBlocks, rep.Removed, len(s.Live()), len(live))
	}
	if failed := s.Sweep(f.e, now()); len(failed) != 0 {
		t.Fatalf("retry: %v", failed)
	}
	rep = snap(s, clock)
	if rep.CoveredBlocks != 2 || rep.Removed != 2 || rep.Functions[0].Covered != 2 {
		t.Errorf("after the retry: covered %d (function %d), removed %d; want 2, 2", rep.CoveredBlocks, rep.Functions[0].Covered, rep.Removed)
	}
	if n := len(rep.Timeline); n != 3 || rep.Timeline[n-1].LiveProbes != len(live)-2 || rep.Timeline[n-1].Covered != 2 {
		t.Errorf("timeline %+v", rep.Timeline)
	}

	// Mark: a hit counted, nothing removed.
	c := s.Live()[0].Request
	f.k.Count(c.Site().Addr(), 1)
	s.Mark(f.e, now())
	if rep = snap(s, clock); rep.CoveredBlocks != 3 || len(s.Live()) != len(live)-2 {
		t.Errorf("mark: covered %d, live %d", rep.CoveredBlocks, len(s.Live()))
	}
	s.Mark(f.e, now()) // again: not counted twice
	if rep = snap(s, clock); rep.CoveredBlocks != 3 {
		t.Errorf("mark twice: covered %d", rep.CoveredBlocks)
	}

	if done, err := s.Remove(f.e); !done || err != nil {
		t.Fatalf("remove: %v, %v", done, err)
	}
	f.e.Reclaim()
	if !bytes.Equal(f.k.TextNow(), enginetest.Text) || len(f.k.Splices) != 0 {
		t.Errorf("after Remove: text % x, %d splices", f.k.TextNow(), len(f.k.Splices))
	}
}

// TestSetRefusals: an engine that refuses every splice leaves each block
// refused with its error and nothing live; a function that cannot be
// read is listed with the reason and no blocks.
func TestSetRefusals(t *testing.T) {
	f := newFixture(t)
	f.k.FailSplice = true
	s := f.set(t, "filename_lookup")
	s.AddUnreadable(kernel.Symbol{Name: "gone", Addr: 0x1234}, errors.New("not mapped"))
	s.Arm(f.e, "test", Flag(nil), time.Now)
	rep := snap(s, time.Now())
	if rep.Armed != 0 || len(s.Live()) != 0 || rep.Functions[0].Refused != len(rep.Functions[0].Blocks) {
		t.Errorf("armed %d, live %d, refused %d of %d", rep.Armed, len(s.Live()), rep.Functions[0].Refused, len(rep.Functions[0].Blocks))
	}
	for _, b := range rep.Functions[0].Blocks {
		if b.Refused == "" {
			t.Errorf("block %d: no reason", b.Index)
		}
	}
	if g := rep.Functions[1]; g.Name != "gone" || g.Error != "not mapped" || len(g.Blocks) != 0 {
		t.Errorf("unreadable function: %+v", g)
	}
	if len(f.k.Splices) != 0 {
		t.Errorf("%d splices after every refusal", len(f.k.Splices))
	}
}

// TestSites: Sites lists the probe sites Add plans, one per block that
// takes one, in block order.
func TestSites(t *testing.T) {
	f := newFixture(t)
	fn, _, err := f.p.Func("filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	sites := Sites(fn)
	if len(sites) == 0 {
		t.Fatal("no sites")
	}
	for i := 1; i < len(sites); i++ {
		if sites[i].Addr() <= sites[i-1].Addr() {
			t.Errorf("sites out of block order: %#x after %#x", sites[i].Addr(), sites[i-1].Addr())
		}
	}
}

// snapshot is what the tests read of a Set: its summary and every
// function (the outer Functions shadows the summary's count).
type snapshot struct {
	Summary
	Functions []Function
}

func snap(s *Set, now time.Time) snapshot {
	return snapshot{s.Summary(now), slices.Collect(s.Functions())}
}

// TestPlanTime: the plan time is from Planning to the first Arm's start,
// and a later Arm (a library loaded after the start) adds to the arm
// time only.
func TestPlanTime(t *testing.T) {
	f := newFixture(t)
	s := f.set(t, "filename_lookup")
	clock := time.Unix(1000, 0)
	now := func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	if s.Summary(clock).Plan != 0 {
		t.Fatal("a plan time before Arm")
	}
	s.Planning(clock.Add(-40 * time.Millisecond))
	s.Arm(f.e, "test", Flag(nil), now) // starts at clock+1ms, ends at +2ms
	sum := s.Summary(clock)
	if sum.Plan != 41*time.Millisecond || sum.Arm != time.Millisecond {
		t.Fatalf("plan %v, arm %v; want 41ms, 1ms", sum.Plan, sum.Arm)
	}
	s.Arm(f.e, "test", Flag(nil), now)
	if sum := s.Summary(clock); sum.Plan != 41*time.Millisecond || sum.Arm != 2*time.Millisecond {
		t.Fatalf("after a second Arm: plan %v, arm %v; want 41ms, 2ms", sum.Plan, sum.Arm)
	}
	if _, err := s.Remove(f.e); err != nil {
		t.Fatal(err)
	}
}
