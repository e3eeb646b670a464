package cover_test

import (
	"bufio"
	"debug/elf"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kinst/kinst/cover"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/engine/enginetest"
	"github.com/kinst/kinst/internal/parallel"
	"github.com/kinst/kinst/splice"
)

// BenchmarkArmKernel is `kinst bench arm --all` without the kernel: every
// block of a debug vmlinux (KINST_VMLINUX) that takes a probe is planned
// (cover.Sites of every function), armed with a hit flag through the
// in-memory driver and removed, as kerninstd does it. It reports each
// phase's seconds, the probes, and the heap in use while they are armed:
// kerninstd's own share of a whole-kernel session (in the TCG guest its
// figures are some ten times these).
func BenchmarkArmKernel(b *testing.B) {
	path := os.Getenv("KINST_VMLINUX")
	if path == "" {
		b.Skip("KINST_VMLINUX is not set (a kernel's vmlinux with symbols)")
	}
	for i := 0; i < b.N; i++ {
		k, kallsyms := vmlinuxKernel(b, path)
		k.Counters = make([]uint64, 1<<20)
		e := engine.New(engine.Config{Device: k, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		p, err := enginetest.Planner(e.Text(), e.Springboards(), kallsyms)
		if err != nil {
			b.Fatal(err)
		}
		syms := p.Symbols()
		runtime.GC()
		start := time.Now()
		var sites []*splice.Site
		all := syms.All()
		// On every CPU, as kerninstd plans a session.
		parallel.Map(len(all), func(i int) []*splice.Site {
			if !all[i].IsText() {
				return nil
			}
			f, err := p.FuncOf(syms, all[i])
			if err != nil {
				return nil
			}
			return cover.Sites(f)
		}, func(_ int, fs []*splice.Site) bool {
			sites = append(sites, fs...)
			return true
		})
		plan := time.Since(start)
		start = time.Now()
		reqs, errs := e.AddEach(sites, engine.Spec{Owner: "bench", Slots: 1, Snippet: cover.Flag(nil)})
		arm := time.Since(start)
		var armed []*engine.Request
		for j, r := range reqs {
			if errs[j] == nil {
				armed = append(armed, r)
			}
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		start = time.Now()
		for _, err := range e.RemoveEach(armed) {
			if err != nil {
				b.Fatal(err)
			}
		}
		remove := time.Since(start)
		b.ReportMetric(plan.Seconds(), "plan-s")
		b.ReportMetric(arm.Seconds(), "arm-s")
		b.ReportMetric(remove.Seconds(), "remove-s")
		b.ReportMetric(float64(len(armed)), "probes")
		b.ReportMetric(float64(len(sites)-len(armed)), "refused")
		b.ReportMetric(float64(ms.HeapInuse>>20), "armed-heap-MiB")
	}
}

// vmlinuxKernel is the in-memory kernel holding path's text sections, and
// a kallsyms file of its symbols.
func vmlinuxKernel(b *testing.B, path string) (*enginetest.Kernel, string) {
	f, err := elf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	k := enginetest.NewSpans(0xffffffffc0000000)
	exec := map[elf.SectionIndex]bool{}
	for i, s := range f.Sections {
		if s.Type == elf.SHT_PROGBITS && s.Flags&elf.SHF_EXECINSTR != 0 && s.Flags&elf.SHF_ALLOC != 0 {
			data, err := s.Data()
			if err != nil {
				b.Fatal(err)
			}
			k.AddText(s.Addr, data)
			exec[elf.SectionIndex(i)] = true
		}
	}
	syms, err := f.Symbols()
	if err != nil {
		b.Fatal(err)
	}
	out, err := os.Create(filepath.Join(b.TempDir(), "kallsyms"))
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	w := bufio.NewWriter(out)
	for _, s := range syms {
		if s.Name == "" || s.Value == 0 || elf.ST_TYPE(s.Info) == elf.STT_SECTION || elf.ST_TYPE(s.Info) == elf.STT_FILE {
			continue
		}
		t := byte('d')
		if exec[s.Section] {
			t = 't'
		}
		if elf.ST_BIND(s.Info) == elf.STB_GLOBAL {
			t -= 'a' - 'A'
		}
		fmt.Fprintf(w, "%016x %c %s\n", s.Value, t, s.Name)
	}
	if err := w.Flush(); err != nil {
		b.Fatal(err)
	}
	return k, out.Name()
}
