package driver

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"
)

// TestABISizes checks the Go mirrors against sizes and ioctl numbers
// worked out by hand from kerninst_uapi.h.
func TestABISizes(t *testing.T) {
	sizes := []struct {
		name      string
		got, want uintptr
	}{
		{"ki_info", unsafe.Sizeof(Info{}), 2*4 + 6*8 + 2*4 + 8 + 2*4},
		{"ki_batch", unsafe.Sizeof(kiBatch{}), 8 + 2*4},
		{"ki_read", unsafe.Sizeof(kiRead{}), 3 * 8},
		{"ki_patch_write", unsafe.Sizeof(kiPatchWrite{}), 3 * 8},
		{"ki_splice", unsafe.Sizeof(kiSplice{}), 2*8 + 2*4 + 2*16 + 2*4},
		{"ki_resplice", unsafe.Sizeof(kiResplice{}), 2*4 + 8},
		{"ki_unsplice", unsafe.Sizeof(kiUnsplice{}), 2 * 4},
		{"ki_counters_clear", unsafe.Sizeof(kiCountersClear{}), 2 * 4},
	}
	for _, s := range sizes {
		if s.got != s.want {
			t.Errorf("sizeof(struct %s): Go %d, want %d", s.name, s.got, s.want)
		}
	}
	// _IOR(0xB7, 0, 64) = 2<<30 | 64<<16 | 0xB7<<8 | 0, and so on.
	nums := []struct {
		name      string
		got, want uintptr
	}{
		{"KI_IOC_INFO", iocInfo, 0x8050b700},
		{"KI_IOC_READ", iocReadMem, 0x4018b701},
		{"KI_IOC_PATCH_WRITE", iocPatchWrite, 0x4018b703},
		{"KI_IOC_SPLICE", iocSplice, 0xc040b705},
		{"KI_IOC_UNSPLICE", iocUnsplice, 0x4008b706},
		{"KI_IOC_COUNTERS_CLEAR", iocCountersClear, 0x4008b707},
		{"KI_IOC_RESPLICE", iocResplice, 0x4010b708},
		{"KI_IOC_COVER_FINISH", iocCoverFinish, 0x8008b709},
		{"KI_IOC_SPLICE_BATCH", iocSpliceBatch, 0xc010b70a},
		{"KI_IOC_UNSPLICE_BATCH", iocUnspliceBatch, 0xc010b70b},
	}
	for _, n := range nums {
		if n.got != n.want {
			t.Errorf("%s: Go %#x, want %#x", n.name, n.got, n.want)
		}
	}
}

// TestABILayout compiles a C program against kerninst_uapi.h and checks
// that the Go mirrors have the same sizes, field offsets and ioctl
// numbers. It skips when gcc is not installed.
func TestABILayout(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	type field struct {
		expr string // C expression printed with %lu
		got  uintptr
	}
	var in Info
	var sp kiSplice
	fields := []field{
		{"sizeof(struct ki_info)", unsafe.Sizeof(in)},
		{"offsetof(struct ki_info, patch_heap)", unsafe.Offsetof(in.PatchHeap)},
		{"offsetof(struct ki_info, counter_heap)", unsafe.Offsetof(in.CounterHeap)},
		{"offsetof(struct ki_info, module_text)", unsafe.Offsetof(in.ModuleText)},
		{"offsetof(struct ki_info, nr_splices)", unsafe.Offsetof(in.Splices)},
		{"offsetof(struct ki_info, int3_hits)", unsafe.Offsetof(in.Int3Hits)},
		{"offsetof(struct ki_info, syncs)", unsafe.Offsetof(in.Syncs)},
		{"offsetof(struct ki_info, max_splices)", unsafe.Offsetof(in.MaxSplices)},
		{"offsetof(struct ki_info, batch_max)", unsafe.Offsetof(in.BatchMax)},
		{"sizeof(struct ki_batch)", unsafe.Sizeof(kiBatch{})},
		{"offsetof(struct ki_batch, n)", unsafe.Offsetof(kiBatch{}.N)},
		{"offsetof(struct ki_batch, failed)", unsafe.Offsetof(kiBatch{}.Failed)},
		{"sizeof(struct ki_read)", unsafe.Sizeof(kiRead{})},
		{"sizeof(struct ki_patch_write)", unsafe.Sizeof(kiPatchWrite{})},
		{"sizeof(struct ki_splice)", unsafe.Sizeof(sp)},
		{"offsetof(struct ki_splice, len)", unsafe.Offsetof(sp.Len)},
		{"offsetof(struct ki_splice, id)", unsafe.Offsetof(sp.ID)},
		{"offsetof(struct ki_splice, orig)", unsafe.Offsetof(sp.Orig)},
		{"offsetof(struct ki_splice, new)", unsafe.Offsetof(sp.New)},
		{"offsetof(struct ki_splice, flags)", unsafe.Offsetof(sp.Flags)},
		{"offsetof(struct ki_splice, patch_len)", unsafe.Offsetof(sp.PatchLen)},
		{"sizeof(struct ki_resplice)", unsafe.Sizeof(kiResplice{})},
		{"offsetof(struct ki_resplice, patch)", unsafe.Offsetof(kiResplice{}.Patch)},
		{"offsetof(struct ki_resplice, patch_len)", unsafe.Offsetof(kiResplice{}.PatchLen)},
		{"KI_SPLICE_SLOT", spliceSlot},
		{"KI_SPLICE_COVER", spliceCover},
		{"sizeof(struct ki_unsplice)", unsafe.Sizeof(kiUnsplice{})},
		{"sizeof(struct ki_counters_clear)", unsafe.Sizeof(kiCountersClear{})},
		{"KI_ABI_VERSION", abiVersion},
		{"KI_MAX_INSN", maxInsn},
		{"KI_IOC_INFO", iocInfo},
		{"KI_IOC_READ", iocReadMem},
		{"KI_IOC_PATCH_WRITE", iocPatchWrite},
		{"KI_IOC_SPLICE", iocSplice},
		{"KI_IOC_UNSPLICE", iocUnsplice},
		{"KI_IOC_COUNTERS_CLEAR", iocCountersClear},
		{"KI_IOC_RESPLICE", iocResplice},
		{"KI_IOC_COVER_FINISH", iocCoverFinish},
		{"KI_IOC_SPLICE_BATCH", iocSpliceBatch},
		{"KI_IOC_UNSPLICE_BATCH", iocUnspliceBatch},
		{"sizeof(struct ki_cover_finish)", unsafe.Sizeof(kiCoverFinish{})},
	}
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"kerninst_uapi.h\"\nint main(void) {\n")
	for _, f := range fields {
		fmt.Fprintf(&src, "\tprintf(\"%%lu\\n\", (unsigned long)(%s));\n", f.expr)
	}
	src.WriteString("\treturn 0;\n}\n")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "abi.c"), []byte(src.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "abi")
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-Wall", "-I", filepath.Join(wd, "linux"), "-o", bin, filepath.Join(dir, "abi.c")).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(out))
	if len(lines) != len(fields) {
		t.Fatalf("C program printed %d values, want %d", len(lines), len(fields))
	}
	for i, f := range fields {
		if want := fmt.Sprint(uint64(f.got)); lines[i] != want {
			t.Errorf("%s: C %s, Go %s", f.expr, lines[i], want)
		}
	}
}
