package report

import (
	"fmt"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
)

// Source lines of coverage reports: a report holds runtime addresses
// only; these map them to source lines with the code's debug
// information (a debug vmlinux, a process's executable or library), so a
// report saved with --json can be annotated on another machine.

// Annotation says what annotating a report did.
type Annotation struct {
	Slide     uint64   // runtime − link-time address (KASLR); a module's: its most common section's
	Functions int      // functions given lines
	Modules   []string // functions of modules: no lines
	Unmatched []string // functions the vmlinux does not have at the slid address
}

// Annotate fills the Lines of every block of the report's kernel
// functions from dbg: the line of the block's first byte (addr2line's),
// then every line of its bytes [Start, End), sorted, each once. Runtime
// addresses become link-time ones by the KASLR slide, the difference
// between a function's address in the report and its symbol's in the
// vmlinux, the same for every function of the kernel image (the most
// common one is taken; a function that disagrees is left without lines
// and named in Unmatched). Functions of modules get no lines. A vmlinux
// that has none of the report's functions gives an error.
func Annotate(rep *api.CoverReport, dbg *debuginfo.File) (Annotation, error) {
	return AnnotateModule(rep, dbg, "")
}

// AnnotateModule is Annotate for the functions of one module of the
// report ("" the kernel image, or a process's executable; a library's
// base name), from that file's debug information; the functions of
// other modules are listed in Modules.
func AnnotateModule(rep *api.CoverReport, dbg *debuginfo.File, module string) (Annotation, error) {
	var a Annotation
	syms := dbg.Symbols()
	// A relocatable file's sections (a kernel module's) were each placed
	// by the module loader: one slide per section, voted by the
	// functions in it. An executable has one slide for all.
	section := func(link uint64) string {
		s, _ := dbg.SectionAt(link)
		return s.Name
	}
	votes := map[string]map[uint64]int{}
	all := map[uint64]int{}
	for _, f := range rep.Functions {
		if f.Module != module || f.Error != "" {
			continue
		}
		if link, ok := syms.Addr(f.Function); ok {
			sec := section(link)
			if votes[sec] == nil {
				votes[sec] = map[uint64]int{}
			}
			votes[sec][uint64(f.Address)-link]++
			all[uint64(f.Address)-link]++
		}
	}
	var best int
	a.Slide, best = MostVoted(all)
	if best == 0 {
		what := "kernel functions: not this kernel's debug vmlinux"
		if module != "" {
			what = module + " functions: not that module's debug file"
		}
		return a, fmt.Errorf("%s has none of the report's %s", dbg.Path, what)
	}
	slides := map[string]uint64{}
	for sec, v := range votes {
		slides[sec], _ = MostVoted(v)
	}
	// The functions matched and their slides first, then every block's
	// line table read at once (Preload: on every CPU), then the lookups.
	type match struct {
		f     *api.CoverFunction
		slide uint64
	}
	var matched []match
	var starts []uint64
	for i := range rep.Functions {
		f := &rep.Functions[i]
		if f.Error != "" {
			continue
		}
		if f.Module != module {
			a.Modules = append(a.Modules, f.Function+" ["+f.Module+"]")
			continue
		}
		// The file must have a symbol of the function's name at the
		// slid address (of several static functions of one name, the
		// one there is the report's).
		at, named := syms.Addr(f.Function)
		slide, ok := slides[section(at)]
		if !named || !ok {
			slide = a.Slide
		}
		link := uint64(f.Address) - slide
		if !named || at != link {
			if s, off, ok := syms.Lookup(link); !ok || off != 0 || s.Name != f.Function {
				a.Unmatched = append(a.Unmatched, f.Function)
				continue
			}
		}
		a.Functions++
		matched = append(matched, match{f, slide})
		for _, b := range f.Blocks {
			starts = append(starts, uint64(b.Start)-slide)
		}
	}
	dbg.Preload(starts)
	for _, m := range matched {
		for j := range m.f.Blocks {
			b := &m.f.Blocks[j]
			lo, hi := uint64(b.Start)-m.slide, uint64(b.End)-m.slide
			if b.End == 0 { // a report of a kerninstd that did not give ends
				hi = lo
			}
			b.Lines = blockLines(dbg, lo, hi)
		}
	}
	if a.Functions == 0 && len(a.Unmatched) > 0 {
		return a, fmt.Errorf("%s does not match the report's code: %d functions are not where the report puts them",
			dbg.Path, len(a.Unmatched))
	}
	return a, nil
}

// MostVoted is the slide most functions agree on (the smallest of a
// tie, so the answer does not depend on map order) and how many do.
func MostVoted(votes map[uint64]int) (slide uint64, n int) {
	for s, v := range votes {
		if v > n || v == n && s < slide {
			slide, n = s, v
		}
	}
	return slide, n
}

// blockLines are a block's lines: its first byte's, then the rest of
// [lo, hi) (a block without an end: its first byte's only).
func blockLines(dbg *debuginfo.File, lo, hi uint64) []string {
	out := []string{}
	first, err := dbg.LineAt(lo)
	if err != nil || first.Line == 0 {
		return out
	}
	out = append(out, first.String())
	if hi <= lo {
		return out
	}
	rest, _ := dbg.Lines(lo, hi)
	for _, l := range rest {
		if l != first {
			out = append(out, l.String())
		}
	}
	return out
}
