package splice

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// loadedModule is a line of /proc/modules: a module that is live, and
// where its memory lies.
type loadedModule struct {
	name     string
	addr, sz uint64
}

// parseModules reads /proc/modules: "NAME SIZE REFS DEPS STATE ADDR".
// A module still unloading is listed: it is gone only once it has left
// the list, since the driver restores its splices in the module notifier
// that runs after the state turns to unloading; forgetting its points
// before that would retire patches a splice still jumps to. Addresses
// read as 0 without the right to see them; such a module is listed with
// addr 0.
func parseModules(b []byte) []loadedModule {
	var ms []loadedModule
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		sz, err1 := strconv.ParseUint(f[1], 10, 64)
		addr, err2 := strconv.ParseUint(strings.TrimPrefix(f[5], "0x"), 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		ms = append(ms, loadedModule{f[0], addr, sz})
	}
	return ms
}

// goneModules is the modules of before that after does not list at the
// same place: unloaded (or unloaded and loaded elsewhere).
func goneModules(before, after []loadedModule) []loadedModule {
	now := make(map[loadedModule]bool, len(after))
	for _, m := range after {
		now[m] = true
	}
	var gone []loadedModule
	for _, m := range before {
		if !now[m] && m.addr != 0 {
			gone = append(gone, m)
		}
	}
	return gone
}

// Refresh looks at the module list (Config.Modules) and, if it changed
// since the last look, forgets what kinst knew of the text of every
// module that went: its springboard runs, and, through Config.TextGone,
// the engine's points there (the driver restored their splices as the
// module went). Then it reloads the symbols, so that a module loaded
// elsewhere, or another module at the same place, is planned where it
// is now, not where a stale snapshot says. Call it before planning a
// request: it reads one small file.
//
// A module unloaded and loaded again at the same address with the same
// size between two looks leaves the list as it was; its text is the same
// code, and the engine finds its points gone when it next changes one.
func (p *Planner) Refresh() error {
	if p.modPath == "" {
		return nil
	}
	b, err := os.ReadFile(p.modPath)
	if err != nil {
		return fmt.Errorf("module list: %w", err)
	}
	p.modMu.Lock()
	defer p.modMu.Unlock()
	if bytes.Equal(b, p.modSeen) {
		return nil
	}
	before := parseModules(p.modSeen)
	p.modSeen = b
	for _, m := range goneModules(before, parseModules(b)) {
		p.log.Info("module gone: its text forgotten", "module", m.name, "at", fmt.Sprintf("%#x", m.addr), "size", m.sz)
		if p.heap != nil {
			p.heap.Forget(m.addr, m.addr+m.sz)
		}
		if p.textGone != nil {
			p.textGone(m.addr, m.addr+m.sz)
		}
	}
	_, err = p.ReloadSymbols()
	return err
}
