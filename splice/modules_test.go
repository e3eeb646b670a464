package splice

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

func TestGoneModules(t *testing.T) {
	const before = `evdev 28672 0 - Live 0xffffffffc03d9000
virtio_net 73728 0 - Live 0xffffffffc0300000
failover 16384 1 net_failover, Live 0xffffffffc0200000
`
	for _, tc := range []struct {
		name, after string
		gone        []string
	}{
		{"nothing changed", before, nil},
		{"unloaded", "virtio_net 73728 0 - Live 0xffffffffc0300000\nfailover 16384 1 net_failover, Live 0xffffffffc0200000\n", []string{"evdev"}},
		{"reloaded elsewhere", strings.Replace(before, "0xffffffffc03d9000", "0xffffffffc0500000", 1), []string{"evdev"}},
		{"reloaded in place", before, nil},
		{"still unloading", strings.Replace(before, "0 - Live 0xffffffffc03d9000", "0 - Unloading 0xffffffffc03d9000", 1), nil},
		{"another loaded", before + "loop 32768 0 - Loading 0xffffffffc0600000\n", nil},
		{"addresses hidden", strings.ReplaceAll(before, "0xffffffffc0", "0x0000000000"), []string{"evdev", "virtio_net", "failover"}},
		{"garbage", "not a module list\n\n", []string{"evdev", "virtio_net", "failover"}},
	} {
		var got []string
		for _, m := range goneModules(parseModules([]byte(before)), parseModules([]byte(tc.after))) {
			got = append(got, m.name)
		}
		if !slices.Equal(got, tc.gone) {
			t.Errorf("%s: gone %v, want %v", tc.name, got, tc.gone)
		}
	}
	// A module whose address reads as 0 (no right to see it) is never
	// taken as gone: its range is unknown.
	hidden := parseModules([]byte("evdev 28672 0 - Live 0x0000000000000000\n"))
	if gone := goneModules(hidden, nil); len(gone) != 0 {
		t.Errorf("hidden-address module gone: %v", gone)
	}
}

// Refresh: a module that went has its springboard runs forgotten and its
// text range handed to TextGone, and the symbols are read again (a
// function of a module loaded since is found); an unchanged list does
// nothing.
func TestRefresh(t *testing.T) {
	dir := t.TempDir()
	syms, mods := filepath.Join(dir, "kallsyms"), filepath.Join(dir, "modules")
	os.WriteFile(syms, []byte(fixtureSyms), 0o600) // drvfn in [kerninst] at 0xffffffffc0000000
	os.WriteFile(mods, []byte("kerninst 4096 0 - Live 0xffffffffc0000000\n"), 0o600)
	heap := springboard.NewHeap()
	view, err := kernel.Live(fixtureText(), kernel.LiveOptions{Kallsyms: syms})
	if err != nil {
		t.Fatal(err)
	}
	var gone [][2]uint64
	p, err := New(Config{Kernel: view, Springboards: heap, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Modules: mods, TextGone: func(lo, hi uint64) { gone = append(gone, [2]uint64{lo, hi}) }})
	if err != nil {
		t.Fatal(err)
	}
	heap.AddFunction(0xffffffffc0000000, func() []springboard.Range {
		return []springboard.Range{{Start: 0xffffffffc0000010, End: 0xffffffffc0000020}}
	})
	first := p.Symbols()
	if err := p.Refresh(); err != nil || len(gone) != 0 || p.Symbols() != first {
		t.Fatalf("unchanged list: err %v, gone %v, symbols reloaded %v", err, gone, p.Symbols() != first)
	}
	// kerninst goes; other comes.
	os.WriteFile(syms, []byte(strings.Replace(fixtureSyms, "ffffffffc0000000 t drvfn\t[kerninst]", "ffffffffc0001000 t otherfn\t[other]", 1)), 0o600)
	os.WriteFile(mods, []byte("other 4096 0 - Live 0xffffffffc0001000\n"), 0o600)
	if err := p.Refresh(); err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || gone[0] != [2]uint64{0xffffffffc0000000, 0xffffffffc0001000} {
		t.Errorf("TextGone told %x, want kerninst's range", gone)
	}
	if len(heap.Runs()) != 0 || heap.Seen(0xffffffffc0000000) {
		t.Errorf("kerninst's springboard runs kept: %v", heap.Runs())
	}
	if _, _, _, err := p.Lookup("otherfn"); err != nil {
		t.Errorf("a module loaded since: %v", err)
	}
	if _, _, err := p.Symbols().Lookup("drvfn"); err == nil {
		t.Error("the gone module's function is still in the symbols")
	}
}
