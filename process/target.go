package process

import (
	"bufio"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

// Target is a running process under kinst's engine: its executable's and
// libraries' symbols placed where they are mapped, a planner over its
// text, and an engine splicing it through a Device.
type Target struct {
	PID    int
	Dev    *Device
	Eng    *engine.Engine
	Syms   *kernel.Symbols
	facts  *splice.Facts
	exe    string // the executable's module name (its base name)
	vdso   [2]uint64
	verdit *splice.Verdicts
}

// mapping is one file-backed line of /proc/PID/maps.
type mapping struct {
	elfsym.Mapping
	path string
}

func readMaps(pid int) ([]mapping, [2]uint64, error) {
	var vdso [2]uint64
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, vdso, fmt.Errorf("%w: %d", ErrNoProcess, pid)
	}
	defer f.Close()
	var out []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		lo, hi, _ := strings.Cut(fs[0], "-")
		start, _ := strconv.ParseUint(lo, 16, 64)
		end, _ := strconv.ParseUint(hi, 16, 64)
		off, _ := strconv.ParseUint(fs[2], 16, 64)
		if len(fs) >= 6 && fs[5] == "[vdso]" {
			vdso = [2]uint64{start, end}
		}
		if len(fs) < 6 || !strings.HasPrefix(fs[5], "/") {
			continue
		}
		out = append(out, mapping{Mapping: elfsym.Mapping{Start: start, End: end, Offset: off, Perms: fs[1]}, path: strings.Join(fs[5:], " ")})
	}
	return out, vdso, sc.Err()
}

// Attach reads pid's symbols and maps kinst's region into it near the
// executable's text (near a library's when lib names one).
func Attach(pid int, lib string) (*Target, error) {
	maps, vdso, err := readMaps(pid)
	if err != nil {
		return nil, err
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	t := &Target{PID: pid, exe: filepath.Base(exe), vdso: vdso, verdit: splice.NewVerdicts()}
	byPath := map[string][]elfsym.Mapping{}
	var order []string
	for _, m := range maps {
		if byPath[m.path] == nil {
			order = append(order, m.path)
		}
		byPath[m.path] = append(byPath[m.path], m.Mapping)
	}
	var parts []*kernel.Symbols
	near := uint64(0)
	for _, path := range order {
		ms := byPath[path]
		var text *elfsym.Mapping
		for i := range ms {
			if strings.Contains(ms[i].Perms, "x") {
				text = &ms[i]
			}
		}
		if text == nil {
			continue
		}
		f, err := elf.Open(fmt.Sprintf("/proc/%d/root%s", pid, path))
		if err != nil {
			continue // deleted, or not ELF
		}
		bias, err := elfsym.LoadSegments(f).MappingBias(*text, ms)
		f.Close()
		if err != nil {
			continue
		}
		mod := filepath.Base(path)
		if mod == t.exe {
			mod = ""
		}
		s, err := kernel.SymbolsFromELF(fmt.Sprintf("/proc/%d/root%s", pid, path), kernel.ELFOptions{Module: mod, Slide: bias})
		if err != nil {
			continue
		}
		parts = append(parts, s)
		if (lib == "" && mod == "") || (lib != "" && libMatches(lib, filepath.Base(path))) {
			near = text.Start
		}
	}
	if len(parts) == 0 {
		return nil, fmt.Errorf("process %d: no ELF file with symbols is mapped", pid)
	}
	if near == 0 {
		if lib != "" {
			return nil, fmt.Errorf("process %d maps no library %q", pid, lib)
		}
		near = maps[0].Start
	}
	t.Syms = kernel.MergeSymbols(parts...)
	dev, err := Open(pid, near)
	if err != nil {
		return nil, err
	}
	t.Dev = dev
	t.Eng = engine.New(engine.Config{Device: dev, PatchHeap: dev.Base, RedZone: 128})
	t.facts = &splice.Facts{Symbols: t.Syms, Text: t.Eng.Text()}
	return t, nil
}

// libMatches: "libc" names libc.so.6, "libc.so.6" too.
func libMatches(lib, base string) bool {
	return base == lib || strings.HasPrefix(base, lib+".") || strings.HasPrefix(base, lib+"-")
}

// ErrNoFunction is returned for a point naming no function of the
// process.
var ErrNoFunction = errors.New("no such function in the process")

// Resolve plans a point: FUNC, FUNC+0xOFF, FUNC:BLOCK, each optionally
// LIB: first (LIB:FUNC…), in the executable unless a library is named.
func (t *Target) Resolve(spec string) (*splice.Site, error) {
	lib, rest := "", spec
	if i := strings.IndexByte(spec, ':'); i >= 0 {
		if _, err := strconv.Atoi(spec[i+1:]); err != nil {
			lib, rest = spec[:i], spec[i+1:]
		}
	}
	p, err := splice.ParsePoint(rest)
	if err != nil {
		return nil, err
	}
	p.Classic = nil
	p.Function = strings.SplitN(rest, "+", 2)[0]
	p.Function = strings.SplitN(p.Function, ":", 2)[0]
	var sym kernel.Symbol
	found := 0
	for _, s := range t.Syms.Named(p.Function) {
		if (lib == "" && s.Module == "") || (lib != "" && libMatches(lib, s.Module)) {
			if found == 0 {
				sym = s
			}
			found++
		}
	}
	if found == 0 {
		where := "the executable"
		if lib != "" {
			where = lib
		}
		return nil, fmt.Errorf("%w: %s in %s", ErrNoFunction, p.Function, where)
	}
	if t.vdso[0] <= sym.Addr && sym.Addr < t.vdso[1] {
		return nil, fmt.Errorf("%s is in the vDSO, which the kernel shares between processes: not spliced", spec)
	}
	end := t.Syms.End(sym)
	if end <= sym.Addr || end-sym.Addr > 1<<20 {
		return nil, fmt.Errorf("%s: function size unknown", p.Function)
	}
	code := make([]byte, end-sym.Addr)
	if err := t.Eng.Text().Read(sym.Addr, code); err != nil {
		return nil, err
	}
	fn, err := cfg.Decode(sym.Name, sym.Module, sym.Addr, code)
	if err != nil {
		return nil, err
	}
	f := t.facts.Func(fn, t.verdit)
	f.Sym, f.Ambiguous = sym, found-1
	s, err := f.Resolve(p)
	if err != nil {
		return nil, err
	}
	s.Point.Spec = spec
	return s, nil
}

// Count installs a counter at each point, all or none; the requests'
// counter slots are read with Dev.Counter(r.Counter()).
func (t *Target) Count(owner string, sites []*splice.Site) ([]*engine.Request, error) {
	reqs, errs := t.Eng.AddEach(sites, engine.Spec{Owner: owner, Slots: 1, Snippet: engine.CounterSnippet})
	for i, err := range errs {
		if err != nil {
			var ok []*engine.Request
			for j, r := range reqs {
				if errs[j] == nil && r != nil {
					ok = append(ok, r)
				}
			}
			t.Eng.RemoveEach(ok)
			return nil, fmt.Errorf("%s: %w", sites[i].Point.Spec, err)
		}
	}
	return reqs, nil
}

// Abandon lets go of a process that has exited: nothing to restore.
func (t *Target) Abandon() {
	t.Dev.mu.Lock()
	t.Dev.splices = map[uint32]*spliced{}
	t.Dev.mu.Unlock()
	t.Dev.Close()
}

// Close removes every request and lets the process go; every byte of its
// text is as it was.
func (t *Target) Close() error {
	t.Eng.Reclaim()
	return t.Dev.Close()
}
