package kerninstd

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/kinst/kinst/census"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// kernelAnalysis is what the whole-kernel pass produces: the census and
// the functions that never return. It is persisted per kernel build and
// module set, so a restarted kerninstd does not redo it. Per-function
// blocks and liveness are not stored: they are recomputed on demand in
// well under a millisecond from the live bytes.
type kernelAnalysis struct {
	Key      string       `json:"key"`
	Created  time.Time    `json:"created"`
	Stats    census.Stats `json:"stats"`
	NoReturn []string     `json:"noreturn"` // "sym+0xoff" of the function starts, core kernel relative to _text, or "module:name"
	// Reads are the callee summaries: what each function reads before
	// writing, as a cfg.LiveSet, by portable name.
	Reads map[string]uint32 `json:"reads"`
}

// analysisKey identifies the kernel build (GNU build id from
// /sys/kernel/notes) and the set of loaded modules.
func analysisKey(notes, modules string) (string, error) {
	b, err := os.ReadFile(notes)
	if err != nil {
		return "", err
	}
	id, err := buildID(b)
	if err != nil {
		return "", err
	}
	var mods []string
	if f, err := os.Open(modules); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fields := strings.Fields(sc.Text()); len(fields) > 0 {
				mods = append(mods, fields[0])
			}
		}
		f.Close()
	}
	sort.Strings(mods)
	h := sha256.Sum256([]byte(strings.Join(mods, ",")))
	return id + "-" + hex.EncodeToString(h[:6]), nil
}

// buildID finds the NT_GNU_BUILD_ID note in raw ELF notes.
func buildID(notes []byte) (string, error) {
	if id, ok := elfsym.NotesBuildID(binary.LittleEndian, notes); ok {
		return id, nil
	}
	return "", elfsym.ErrNoBuildID
}

// kernelCensus is the daemon's whole-kernel analysis: the census and the
// call graph, computed on request or at start-up (Prepare) with one
// worker, or read from the cache, and what it tells the planner (the
// functions that never return, the callee summaries, springboard runs).
type kernelCensus struct {
	plan *splice.Planner
	eng  *engine.Engine
	log  *slog.Logger

	cacheDir, notesPath, modulesPath string

	mu       sync.Mutex        // protects stats, calls and callSyms
	stats    *census.Stats     // the whole-kernel census
	calls    *census.CallGraph // its call graph (not cached on disk)
	callSyms *kernel.Symbols   // the symbols the graph's addresses belong to
}

// analyze runs the whole-kernel analysis (package census) and gives its
// results to the planner. workers bounds the CPU it takes; progress may
// be nil.
func (c *kernelCensus) analyze(ctx context.Context, workers int, progress func(done, total int)) (census.Stats, error) {
	syms, err := c.plan.ReloadSymbols()
	if err != nil {
		return census.Stats{}, err
	}
	k, err := census.Analyze(ctx, c.eng.Text(), syms, census.Options{
		Prototypes: c.plan.Prototypes(),
		Owned:      c.plan.Owned(),
		Progress:   progress,
		Workers:    workers,
	})
	if err != nil {
		return census.Stats{}, err
	}
	c.plan.SetAnalysis(k.NoReturn, k.Reads)
	c.eng.Springboards().Add(k.SpringboardRuns...)
	c.mu.Lock()
	c.calls, c.callSyms = &k.Calls, syms
	c.mu.Unlock()
	if c.cacheDir != "" {
		if err := c.saveAnalysis(syms, k.Stats, k.NoReturn, k.Reads); err != nil {
			c.log.Warn("analysis cache not saved", "err", err)
		}
	}
	return k.Stats, nil
}

func (c *kernelCensus) cachePath() (string, error) {
	key, err := analysisKey(c.notesPath, c.modulesPath)
	if err != nil {
		return "", err
	}
	return filepath.Join(c.cacheDir, "analysis-"+key+".json"), nil
}

func (c *kernelCensus) saveAnalysis(syms *kernel.Symbols, st census.Stats, noret cfg.NoReturnSet, reads cfg.CalleeReads) error {
	path, err := c.cachePath()
	if err != nil {
		return err
	}
	a := kernelAnalysis{Key: filepath.Base(path), Created: time.Now(), Stats: st}
	for addr := range noret {
		if name, ok := syms.Portable(addr); ok {
			a.NoReturn = append(a.NoReturn, name)
		}
	}
	sort.Strings(a.NoReturn)
	a.Reads = make(map[string]uint32, len(reads))
	for addr, r := range reads {
		if name, ok := syms.Portable(addr); ok {
			a.Reads[name] = uint32(r)
		}
	}
	b, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.cacheDir, 0o700); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// loadAnalysis restores a saved analysis for this kernel build and module
// set; false if there is none.
func (c *kernelCensus) loadAnalysis() (census.Stats, bool, error) {
	if c.cacheDir == "" {
		return census.Stats{}, false, nil
	}
	path, err := c.cachePath()
	if err != nil {
		return census.Stats{}, false, err
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return census.Stats{}, false, nil
	}
	if err != nil {
		return census.Stats{}, false, err
	}
	var a kernelAnalysis
	if err := json.Unmarshal(b, &a); err != nil {
		return census.Stats{}, false, fmt.Errorf("%s: %w", path, err)
	}
	syms := c.plan.Symbols()
	s := cfg.NoReturnSet{}
	for _, name := range a.NoReturn {
		if addr, ok := syms.FromPortable(name); ok {
			s[addr] = true
		}
	}
	reads := make(cfg.CalleeReads, len(a.Reads))
	for name, r := range a.Reads {
		if addr, ok := syms.FromPortable(name); ok {
			reads[addr] = cfg.LiveSet(r)
		}
	}
	c.plan.SetAnalysis(s, reads)
	return a.Stats, true, nil
}

// Prepare reads what the planner knows of the kernel (its prototypes from
// BTF, the instructions the kernel owns, its blacklist and die notifiers)
// so that the first request does not wait for it, then loads the cached
// whole-kernel analysis, or, if compute is set, computes it (with one
// worker, so the daemon stays responsive) and saves it. Without it the
// analysis runs on the first census request.
func (d *Daemon) Prepare(ctx context.Context, compute bool) { d.an.prepare(ctx, compute) }

// prepare is Daemon.Prepare.
func (c *kernelCensus) prepare(ctx context.Context, compute bool) {
	start := time.Now()
	c.plan.Facts()
	c.log.Info("read the kernel's facts for planning", "took", time.Since(start))
	start = time.Now()
	if st, ok, err := c.loadAnalysis(); err != nil {
		c.log.Warn("analysis cache unreadable", "err", err)
	} else if ok {
		c.setStats(st)
		c.log.Info("loaded kernel analysis from cache", "noreturn", st.NoReturn, "took", time.Since(start))
		return
	}
	if !compute {
		return
	}
	st, err := c.analyze(ctx, 1, nil)
	if err != nil {
		c.log.Warn("kernel analysis failed", "err", err)
		return
	}
	c.setStats(st)
	c.log.Info("analysed the kernel", "functions", st.Functions, "noreturn", st.NoReturn, "took", time.Since(start))
}

func (c *kernelCensus) setStats(st census.Stats) {
	c.mu.Lock()
	c.stats = &st
	c.mu.Unlock()
}
