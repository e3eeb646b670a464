package live

import (
	"context"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kinst/kinst/census"
	"github.com/kinst/kinst/kernel"
)

// fileText serves kernel text from the vmlinux ELF, relocated to where
// KASLR put the running kernel.
type fileText struct {
	base  uint64 // runtime address of .text
	bytes []byte
}

func (f *fileText) Read(addr uint64, b []byte) error {
	if addr < f.base || addr+uint64(len(b)) > f.base+uint64(len(f.bytes)) {
		return errors.New("outside .text")
	}
	copy(b, f.bytes[addr-f.base:])
	return nil
}

// BenchmarkAnalyzeKernel runs the whole-kernel analysis natively on the
// Debian vmlinux (its .text relocated with the guest's kallsyms), and
// objdump -d of the same text for comparison:
//
//	go test -run XXX -bench AnalyzeKernel -benchtime 3x ./test/live
func BenchmarkAnalyzeKernel(b *testing.B) {
	ctx := context.Background()
	cache := os.Getenv("KINST_CACHE")
	if cache == "" {
		cache = filepath.Join(repoRoot(), ".cache")
	}
	vmlinux, err := guest.Kernel(cache).Vmlinux()
	if err != nil {
		b.Fatal(err)
	}
	var out strings.Builder
	if code, err := guest.Exec(ctx, []string{"sh", "-c", "grep -v '\\[' /proc/kallsyms"}, &out, new(strings.Builder)); err != nil || code != 0 {
		b.Fatalf("kallsyms: %v %d", err, code)
	}
	syms, err := kernel.ParseKallsyms(strings.NewReader(out.String()))
	if err != nil {
		b.Fatal(err)
	}
	f, err := elf.Open(vmlinux)
	if err != nil {
		b.Fatal(err)
	}
	text := f.Section(".text")
	data, err := text.Data()
	if err != nil {
		b.Fatal(err)
	}
	runtimeText, _, _ := syms.Lookup("_text")
	linkText := f.Section(".text").Addr // vmlinux is linked at _text == .text
	r := &fileText{base: runtimeText.Addr + (text.Addr - linkText), bytes: data}

	var st census.Stats
	var ms runtime.MemStats
	var ru0, ru1 syscall.Rusage
	b.ReportAllocs()
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		// As kerninstd runs it (without the kernel's own tables, which
		// live in guest memory): springboard space and the covering
		// census too.
		k, err := census.Analyze(ctx, r, syms, census.Options{})
		if err != nil {
			b.Fatal(err)
		}
		st = k.Stats
	}
	b.StopTimer()
	// CPU time as well as wall time: other processes share the cores, so
	// the wall time of a parallel analysis says less than its CPU time.
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := func(r *syscall.Rusage) float64 { return float64(r.Utime.Nano()+r.Stime.Nano()) / 1e9 }
	b.ReportMetric((cpu(&ru1)-cpu(&ru0))/float64(b.N), "cpu-s/op")
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(st.Instructions), "insns")
	b.ReportMetric(float64(st.InstructionBytes)/1e6, "MB")
	b.ReportMetric(float64(ms.Sys)/(1<<20), "MiB-sys")

	if _, err := exec.LookPath("objdump"); err == nil {
		t0 := time.Now()
		cmd := exec.Command("objdump", "-d", "-j", ".text", vmlinux)
		cmd.Stdout = nil
		if err := cmd.Run(); err == nil {
			b.ReportMetric(time.Since(t0).Seconds(), "objdump-s")
			b.ReportMetric((cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(), "objdump-cpu-s")
		}
	}
	b.ReportMetric(float64(st.Coverable), "coverable")
	b.Logf("%d functions, %d blocks, %d instructions (%d bytes); %d unreadable (module or init text)",
		st.Functions, st.BasicBlocks, st.Instructions, st.InstructionBytes, st.Unreadable)
}
