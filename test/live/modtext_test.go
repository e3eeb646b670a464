package live

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// moduleText is one loaded module's text as read through QEMU, with the
// bytes the kernel itself rewrites there (its jump labels and static
// calls) to leave out of a comparison.
type moduleText struct {
	name   string
	lo, hi uint64
	text   []byte
	kernel map[uint64]bool
}

// isTextSection: a module section that holds code (.text, .text.unlikely,
// .noinstr.text, .sched.text, .exit.text, ...); the core layout puts them
// first, before rodata.
func isTextSection(name string) bool {
	return strings.HasPrefix(name, ".text") || strings.HasSuffix(name, ".text") || name == ".altinstr_replacement"
}

// moduleTexts reads the text of every loaded module but skip's, through
// QEMU: from its first text section to the first other section above it
// (the sections' addresses from /sys/module/*/sections, root only) or the
// end of the page of its last function (/proc/kallsyms), whichever is
// first.
func moduleTexts(t *testing.T, ctx context.Context, skip ...string) []moduleText {
	t.Helper()
	out := gsh(t, ctx, `for m in /sys/module/*/sections; do n=${m%/sections}; n=${n##*/}; for s in $m/.[a-z]* $m/__*; do [ -f "$s" ] && echo "$n ${s##*/} $(cat $s)"; done; done`)
	secs := map[string]map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		v, err := strconv.ParseUint(strings.TrimPrefix(f[2], "0x"), 16, 64)
		if err != nil || v == 0 {
			continue
		}
		if secs[f[0]] == nil {
			secs[f[0]] = map[string]uint64{}
		}
		secs[f[0]][f[1]] = v
	}
	// The highest function of each module: its text ends within that
	// function's page as far as this reads (the page after may be
	// another allocation's, another module's text or kinst's patch heap).
	lastFn := map[string]uint64{}
	for _, line := range strings.Split(gsh(t, ctx, `grep -E '^[0-9a-f]+ [tT] .*\[' /proc/kallsyms`), "\n") {
		f := strings.Fields(line)
		if len(f) != 4 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 16, 64)
		mod := strings.Trim(f[3], "[]")
		if err == nil && v > lastFn[mod] {
			lastFn[mod] = v
		}
	}
	var mods []moduleText
	for name, ss := range secs {
		if slices.Contains(skip, name) {
			continue
		}
		type sec struct {
			name string
			addr uint64
		}
		var sorted []sec
		for n, a := range ss {
			if !strings.HasPrefix(n, ".init") {
				sorted = append(sorted, sec{n, a})
			}
		}
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].addr < sorted[j].addr })
		m := moduleText{name: name, kernel: map[uint64]bool{}}
		for _, s := range sorted {
			if m.lo == 0 && isTextSection(s.name) {
				m.lo = s.addr
			} else if m.lo != 0 && !isTextSection(s.name) && s.addr > m.lo {
				m.hi = s.addr
				break
			}
		}
		if m.lo == 0 || m.hi <= m.lo || m.hi-m.lo > 64<<20 {
			continue // no text, or none bounded by a later section
		}
		if last := lastFn[name]; last >= m.lo {
			m.hi = min(m.hi, last|4095+1)
		}
		// The kernel's own rewrites, as in kernelPatched.
		for _, tab := range []struct {
			name  string
			entry uint64
		}{{"__jump_table", 16}, {".static_call_sites", 8}} {
			at, ok := ss[tab.name]
			if !ok {
				continue
			}
			end := uint64(0)
			for _, s := range sorted {
				if s.addr > at && (end == 0 || s.addr < end) {
					end = s.addr
				}
			}
			if end == 0 || end-at > 1<<20 {
				continue
			}
			markPatched(m.kernel, saveReadable(t, at, end), at, tab.entry)
		}
		m.text = saveReadable(t, m.lo, m.hi)
		m.hi = m.lo + uint64(len(m.text))
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool { return mods[i].name < mods[j].name })
	if len(mods) == 0 {
		t.Fatalf("no module text found under /sys/module/*/sections:\n%s", out)
	}
	return mods
}

// saveReadable is saveText of [lo, hi), or of as much of it as is mapped
// from lo on: since 6.4 a module's text, rodata and data are separate
// allocations, so the section after the last text one can lie beyond a
// hole.
func saveReadable(t *testing.T, lo, hi uint64) []byte {
	t.Helper()
	dir := t.TempDir()
	if b, err := readVirt(t, dir, lo, hi); err == nil {
		return b
	}
	var out []byte
	for a := lo; a < hi; {
		end := min(hi, (a|4095)+1)
		b, err := readVirt(t, dir, a, end)
		if err != nil {
			break
		}
		out, a = append(out, b...), end
	}
	return out
}

// moduleTextDiff compares module text read before and after; a module
// loaded or unloaded between is said so, not compared.
func moduleTextDiff(before, after []moduleText) string {
	byName := map[string]moduleText{}
	for _, m := range after {
		byName[m.name] = m
	}
	var diffs []string
	for _, b := range before {
		a, ok := byName[b.name]
		switch {
		case !ok:
			diffs = append(diffs, b.name+": unloaded")
		case a.lo != b.lo || a.hi != b.hi:
			diffs = append(diffs, fmt.Sprintf("%s: text moved (%#x-%#x → %#x-%#x)", b.name, b.lo, b.hi, a.lo, a.hi))
		default:
			if d := textDiff(b.lo, b.text, a.text, b.kernel); d != "" {
				diffs = append(diffs, b.name+": "+d)
			}
		}
	}
	return strings.Join(diffs, "; ")
}
