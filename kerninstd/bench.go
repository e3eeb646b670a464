package kerninstd

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/kinst/kinst/codegen"
)

// maxBenchCycles bounds one bench request.
const maxBenchCycles = 1_000_000

// BenchSplice measures the steps of an instrumentation request at one
// point: resolve and codegen a few times, then cycles of the driver's
// splice and unsplice of one prepared patch (the part that touches the
// running kernel), then the free. The point is left as it was.
func (d *Daemon) BenchSplice(ctx context.Context, req BenchRequest) (BenchResult, error) {
	if req.Cycles <= 0 || req.Cycles > maxBenchCycles {
		return BenchResult{}, badRequest(fmt.Errorf("cycles %d: want 1..%d", req.Cycles, maxBenchCycles))
	}
	var res BenchResult
	res.Cycles = req.Cycles
	light := min(req.Cycles, 100)

	var s *site
	var resolveT []time.Duration
	for i := 0; i < light; i++ {
		t := time.Now()
		var err error
		if s, err = d.resolve(req.Point); err != nil {
			return res, &PointError{Point: req.Point, Err: err}
		}
		resolveT = append(resolveT, time.Since(t))
	}
	res.Point = s.resolved()
	res.Resolve = summarize(resolveT)

	d.mu.Lock()
	defer d.mu.Unlock()
	in := s.insn()
	if pt, ok := d.points[in.Addr]; ok {
		return res, fmt.Errorf("%s is instrumented by session %s; bench needs it free", s.where(), pt.reqs[0].owner)
	}
	slot, err := d.slots.alloc()
	if err != nil {
		return res, err
	}
	defer d.slots.free(slot)
	n, err := codegen.PatchLen(d.patchHeapBase(), s.patchSpec([]*request{{snippet: codegen.Counter{Addr: d.dev.CounterAddr(slot)}}}))
	if err != nil {
		return res, err
	}
	patch, err := d.dev.PatchAlloc(n)
	if err != nil {
		return res, err
	}
	freed := false
	defer func() {
		if !freed {
			d.dev.PatchFree(patch)
		}
	}()

	var code []byte
	var genT []time.Duration
	for i := 0; i < light; i++ {
		t := time.Now()
		if code, err = buildCounterPatch(patch, s, d.dev.CounterAddr(slot)); err != nil {
			return res, err
		}
		genT = append(genT, time.Since(t))
	}
	res.Codegen = summarize(genT)
	t := time.Now()
	if err := d.dev.PatchWrite(patch, code); err != nil {
		return res, err
	}
	res.Patch = summarize([]time.Duration{time.Since(t)})

	spliceT := make([]time.Duration, 0, req.Cycles)
	unspliceT := make([]time.Duration, 0, req.Cycles)
	for i := 0; i < req.Cycles && ctx.Err() == nil; i++ {
		t0 := time.Now()
		id, err := d.splice(s, s.class, patch)
		if err != nil {
			return res, fmt.Errorf("cycle %d: splice: %w", i, err)
		}
		t1 := time.Now()
		if err := d.dev.Unsplice(id); err != nil {
			return res, fmt.Errorf("cycle %d: unsplice: %w", i, err)
		}
		spliceT = append(spliceT, t1.Sub(t0))
		unspliceT = append(unspliceT, time.Since(t1))
	}
	res.Cycles = len(spliceT)
	res.Splice = summarize(spliceT)
	res.Unsplice = summarize(unspliceT)

	t = time.Now()
	if err := d.dev.PatchFree(patch); err != nil {
		return res, err
	}
	freed = true
	res.Free = summarize([]time.Duration{time.Since(t)})

	now := make([]byte, len(in.Bytes))
	if err := d.dev.Read(in.Addr, now); err != nil {
		return res, err
	}
	res.Restored = bytes.Equal(now, in.Bytes)
	return res, ctx.Err()
}

func summarize(ds []time.Duration) Durations {
	if len(ds) == 0 {
		return Durations{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return Durations{
		N:      len(s),
		Median: int64(s[len(s)/2]),
		P90:    int64(s[len(s)*9/10]),
		Min:    int64(s[0]),
		Max:    int64(s[len(s)-1]),
	}
}
