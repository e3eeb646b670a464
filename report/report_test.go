package report

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/engine/enginetest"
	"github.com/kinst/kinst/splice"
)

func planFixture(t *testing.T) (*enginetest.Kernel, *engine.Engine, *splice.Func) {
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
	f, _, err := p.Func("filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	return k, e, f
}

// CFG lists every block and instruction of the function, in order, each
// instruction once with its class or refusal as the planner gives it.
func TestCFG(t *testing.T) {
	_, _, f := planFixture(t)
	g := CFG(f)
	if g.Function != "filename_lookup" || uint64(g.Address) != f.Fn.Addr || len(g.Blocks) != len(f.Blocks) {
		t.Fatalf("graph %s at %#x with %d blocks; the function has %d", g.Function, uint64(g.Address), len(g.Blocks), len(f.Blocks))
	}
	n := 0
	for bi, b := range g.Blocks {
		if b.Index != bi || b.Succs == nil || b.Preds == nil {
			t.Errorf("block %d: %+v", bi, b)
		}
		for _, in := range b.Instructions {
			want := f.Fn.Insns[n]
			if uint64(in.Address) != want.Addr || in.Length != want.Len() || in.LiveIn == nil {
				t.Errorf("instruction %d: %+v, want at %#x, %d bytes", n, in, want.Addr, want.Len())
			}
			if why := f.Refusal(n); (why != "") != (in.SpliceClass == "refused") || why != in.Refused {
				t.Errorf("instruction %d: class %q refused %q; planner %q", n, in.SpliceClass, in.Refused, why)
			}
			n++
		}
	}
	if n != len(f.Fn.Insns) {
		t.Errorf("%d instructions drawn, the function has %d", n, len(f.Fn.Insns))
	}
}

// Cover carries the Set's totals and every block: a point exactly where
// a probe is, a reason exactly where a block is refused; the summary is
// the same totals without the functions.
func TestCover(t *testing.T) {
	k, e, f := planFixture(t)
	s := cover.New("pid 7")
	s.Add(f)
	now := time.Unix(100, 0)
	s.Arm(e, "t", cover.Flag(nil), func() time.Time { return now })
	live := s.Live()
	if len(live) == 0 {
		t.Fatal("nothing armed")
	}
	if err := k.Count(live[0].Request.Site().Addr(), 1); err != nil {
		t.Fatal(err)
	}
	s.Sweep(e, now.Add(time.Second))
	rep := Cover(s, "sess", now.Add(2*time.Second))
	sum := CoverSummary(s, "sess", now.Add(2*time.Second))
	if rep.Session != "sess" || rep.Filter != "pid 7" || rep.CoveredBlocks < 1 || rep.Removed != 1 || len(rep.Timeline) != 2 ||
		rep.DurationNS != int64(2*time.Second) || len(rep.Functions) != 1 || rep.FunctionCount != 1 {
		t.Fatalf("report %+v", rep)
	}
	if sum.Functions != nil || sum.TotalBlocks != rep.TotalBlocks || sum.CoveredBlocks != rep.CoveredBlocks || sum.Armed != rep.Armed ||
		sum.RefusedBlocks != rep.Functions[0].Refused {
		t.Errorf("summary %+v against report totals %d/%d/%d", sum, rep.TotalBlocks, rep.CoveredBlocks, rep.Armed)
	}
	fn, probes, covered := rep.Functions[0], 0, 0
	for _, b := range fn.Blocks {
		if (b.Point != nil) == (b.Refused != nil) && !b.Inferred {
			t.Errorf("block %d: point %v refused %v", b.Index, b.Point, b.Refused)
		}
		if b.Point != nil {
			probes++
		}
		if b.Covered {
			covered++
		}
		if b.Lines == nil || b.End <= b.Start {
			t.Errorf("block %d: %+v", b.Index, b)
		}
	}
	if probes != rep.Armed || covered != fn.Covered || fn.Total != len(fn.Blocks) || rep.TotalBlocks != fn.Total {
		t.Errorf("%d points for %d armed, %d covered blocks for %d, total %d of %d", probes, rep.Armed, covered, fn.Covered, fn.Total, len(fn.Blocks))
	}
	s.Remove(e)
}
