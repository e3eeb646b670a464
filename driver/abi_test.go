package driver

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"
)

// TestABILayout compiles a C program against kerninst_uapi.h and checks
// that the Go mirrors have the same sizes and ioctl numbers.
func TestABILayout(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "abi.c")
	os.WriteFile(src, []byte(`#include <stdio.h>
#include "kerninst_uapi.h"
int main(void) {
	printf("%zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct ki_info), sizeof(struct ki_read),
		sizeof(struct ki_patch_alloc), sizeof(struct ki_patch_write), sizeof(struct ki_patch_free),
		sizeof(struct ki_splice), sizeof(struct ki_unsplice), sizeof(struct ki_counters_clear));
	printf("%lx %lx %lx %lx %lx %lx %lx %lx\n", (unsigned long)KI_IOC_INFO, (unsigned long)KI_IOC_READ,
		(unsigned long)KI_IOC_PATCH_ALLOC, (unsigned long)KI_IOC_PATCH_WRITE, (unsigned long)KI_IOC_PATCH_FREE,
		(unsigned long)KI_IOC_SPLICE, (unsigned long)KI_IOC_UNSPLICE, (unsigned long)KI_IOC_COUNTERS_CLEAR);
	return 0;
}
`), 0o600)
	bin := filepath.Join(dir, "abi")
	wd, _ := os.Getwd()
	if out, err := exec.Command("gcc", "-I", filepath.Join(wd, "linux"), "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	sizes := strings.Join([]string{
		itoa(unsafe.Sizeof(Info{})), itoa(unsafe.Sizeof(kiRead{})), itoa(unsafe.Sizeof(kiPatchAlloc{})),
		itoa(unsafe.Sizeof(kiPatchWrite{})), itoa(unsafe.Sizeof(kiPatchFree{})), itoa(unsafe.Sizeof(kiSplice{})),
		itoa(unsafe.Sizeof(kiUnsplice{})), itoa(unsafe.Sizeof(kiCountersClear{}))}, " ")
	if lines[0] != sizes {
		t.Errorf("struct sizes: C %s, Go %s", lines[0], sizes)
	}
	var nums []string
	for _, n := range []uintptr{iocInfo, iocRead_, iocPatchAlloc, iocPatchWrite, iocPatchFree, iocSplice, iocUnsplice, iocCountersClear} {
		nums = append(nums, strings.TrimPrefix(hex(n), "0x"))
	}
	if lines[1] != strings.Join(nums, " ") {
		t.Errorf("ioctl numbers: C %s, Go %s", lines[1], strings.Join(nums, " "))
	}
}

func itoa(v uintptr) string { return strconv.FormatUint(uint64(v), 10) }

func hex(v uintptr) string { return strconv.FormatUint(uint64(v), 16) }
