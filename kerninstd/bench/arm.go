package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/internal/parallel"
	"github.com/kinst/kinst/splice"
)

// maxArmBlocks bounds one bench arm request: the driver's splice table.
const maxArmBlocks = 1 << 20

// armOwner owns the probes bench arm makes; no session has this ID.
const armOwner = "bench-arm"

// Arm arms a hit-flag probe at req.Blocks basic blocks, as a
// coverage session does, batched or one at a time, then removes them
// all, and reports the time and the driver's CPU synchronisation rounds
// of each half. Blocks are taken in order from the targets' functions;
// blocks already instrumented are skipped.
func Arm(ctx context.Context, k Kernel, req api.ArmRequest) (api.ArmResult, error) {
	if req.All {
		req.Blocks = maxArmBlocks
	}
	if req.Skip < 0 || req.Skip > maxArmBlocks {
		return api.ArmResult{}, badRequest(fmt.Errorf("skip %d: want 0..%d", req.Skip, maxArmBlocks))
	}
	if req.Blocks <= 0 || req.Blocks > maxArmBlocks {
		return api.ArmResult{}, badRequest(fmt.Errorf("blocks %d: want 1..%d", req.Blocks, maxArmBlocks))
	}
	if err := k.Planner.Refresh(); err != nil {
		k.Log.Warn("module list unreadable; symbols as last read", "err", err)
	}
	targets := req.Targets
	if len(targets) == 0 {
		targets = []string{"*"}
	}
	res := api.ArmResult{Mode: "batched", Blocks: req.Blocks, Refusals: map[string]int{}, RefusedAt: map[string]string{}}
	if req.Single {
		res.Mode = "single"
	}
	start := k.now()
	nfns, fn, err := k.Targets(targets)
	if err != nil {
		return res, err
	}
	sites, functions := planArm(ctx, k, nfns, fn, req.Blocks, req.Skip)
	res.Functions = functions
	if err := ctx.Err(); err != nil {
		return res, err
	}
	if req.All {
		req.Blocks, res.Blocks = len(sites), len(sites)
	}
	if len(sites) < req.Blocks {
		return res, badRequest(fmt.Errorf("the targets have %d blocks that take a probe, fewer than %d", len(sites), req.Blocks))
	}
	res.PlanNS = int64(k.now().Sub(start))
	if len(sites) > 0 {
		res.First, res.Last = sites[0].Where(), sites[len(sites)-1].Where()
	}
	spec := engine.Spec{Owner: armOwner, Slots: 1, Snippet: cover.Flag(nil)}

	// The patches an earlier request retired are freed first (their
	// batched reclaim may be still to come): the heap in use after
	// arming is then this run's, whether or not the last run's reclaim
	// came in between (the second of two runs measured its patches and
	// the first's, or only its own, depending on how long it armed).
	k.Engine.Reclaim()
	syncs := func() uint64 { return k.Info().DriverSyncs }
	s0, t0 := syncs(), k.now()
	armed := armSites(k, sites, spec, req.Single, &res)
	res.ArmNS = int64(k.now().Sub(t0))
	s1 := syncs()
	res.ArmSyncs = s1 - s0
	res.PatchBytes = k.Info().PatchHeapUsed
	res.Armed = len(armed)
	t1 := k.now()
	var rerrs []error
	if req.Single {
		for _, r := range armed {
			rerrs = append(rerrs, k.Engine.Remove(r))
		}
	} else {
		rerrs = k.Engine.RemoveEach(armed)
	}
	res.RemoveNS = int64(k.now().Sub(t1))
	res.PeakRSS = k.Info().PeakRSS
	res.RemoveSyncs = syncs() - s1
	if err := errors.Join(rerrs...); err != nil {
		return res, fmt.Errorf("remove bench probes: %w", err)
	}
	return res, nil
}

// refusalKind is an engine or driver error without its addresses, to
// count refusals by kind.
func refusalKind(err error) string {
	why := err.Error()
	if k := strings.LastIndex(why, ": "); k >= 0 {
		why = why[k+2:]
	}
	return why
}

// planArm plans the targets' functions (nfns of them, fn(i) the i-th) on
// every CPU, taken in order as a coverage session is, and gives the
// first n blocks that take a probe and are not instrumented, after
// skipping skip of them, and how many functions they are in.
func planArm(ctx context.Context, k Kernel, nfns int, fn func(int) (*splice.Func, error), n, skip int) (sites []*splice.Site, functions int) {
	// Planned on every CPU, taken in order (as a coverage session is).
	parallel.Map(nfns, func(i int) []*splice.Site {
		f, err := fn(i)
		if err != nil {
			return nil // not a function kinst can read
		}
		return cover.Sites(f)
	}, func(_ int, fs []*splice.Site) bool {
		if len(sites) >= n || ctx.Err() != nil {
			return false
		}
		took := false
		for _, s := range fs {
			if _, owned := k.Engine.Owner(s.Addr()); owned || len(sites) >= n {
				continue
			}
			if skip > 0 {
				skip--
				continue
			}
			sites, took = append(sites, s), true
		}
		if took {
			functions++
		}
		return true
	})
	return sites, functions
}

// armSites arms a probe of spec at each site, batched (in chunks, as a
// coverage session arms) or one at a time, counting refusals in res, and
// gives the requests armed.
func armSites(k Kernel, sites []*splice.Site, spec engine.Spec, single bool, res *api.ArmResult) []*engine.Request {
	var armed []*engine.Request
	refuse := func(i int, err error) {
		res.Refused++
		kind := refusalKind(err)
		if res.Refusals[kind]++; res.Refusals[kind] == 1 {
			res.RefusedAt[kind] = sites[i].Where()
		}
	}
	if single {
		for i, s := range sites {
			if r, err := k.Engine.Add(s, spec); err != nil {
				refuse(i, err)
			} else {
				armed = append(armed, r)
			}
		}
	} else {
		// As a coverage session arms: the sites handed over in chunks
		// (so the engine's answers for the whole kernel are never held
		// at once).
		before := k.Engine.ArmTimes()
		armed = make([]*engine.Request, 0, len(sites))
		for lo := 0; lo < len(sites); lo += cover.ArmChunk {
			reqs, errs := k.Engine.AddEach(sites[lo:min(lo+cover.ArmChunk, len(sites))], spec)
			for i, r := range reqs {
				if errs[i] != nil {
					refuse(lo+i, errs[i])
				} else {
					armed = append(armed, r)
				}
			}
		}
		after := k.Engine.ArmTimes()
		res.ArmStages = &api.ArmStages{
			PrepareNS: int64(after.Prepare - before.Prepare),
			BuildNS:   int64(after.Build - before.Build),
			WriteNS:   int64(after.Write - before.Write),
			SpliceNS:  int64(after.Splice - before.Splice),
			DriverNS:  int64(after.Driver - before.Driver),
		}
	}
	return armed
}
