// Package livecore tests the postmortem readers on dumps of the real test
// VM (a stock Debian kernel under QEMU), taken through QMP. One VM serves
// every test of the package.
//
// Set KINST_LIVE=0 to skip; KINST_BIN for prebuilt static binaries;
// KINST_CACHE for the download/build cache.
package livecore

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/kinst/kinst/internal/vm"
)

var guest *vm.Instance

func TestMain(m *testing.M) {
	if os.Getenv("KINST_LIVE") == "0" {
		fmt.Println("livecore: KINST_LIVE=0, skipping the live-VM tests")
		os.Exit(0)
	}
	os.Exit(runWithVM(m))
}

func runWithVM(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	tmp, err := os.MkdirTemp("", "kinst-livecore-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	bin := os.Getenv("KINST_BIN")
	if bin == "" {
		bin = filepath.Join(tmp, "bin")
		for _, c := range []string{"kinst", "kerninstd"} {
			cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(bin, c), "./cmd/"+c)
			cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "build %s: %v\n%s", c, err, out)
				return 1
			}
		}
	}
	cache := os.Getenv("KINST_CACHE")
	if cache == "" {
		cache = filepath.Join(root, ".cache")
	}
	guest, err = vm.Up(ctx, vm.Config{
		CacheDir:     cache,
		StateDir:     filepath.Join(tmp, "vm"),
		KinstBin:     filepath.Join(bin, "kinst"),
		KerninstdBin: filepath.Join(bin, "kerninstd"),
		Progress:     os.Stderr,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "livecore: vm up: %v\n", err)
		return 1
	}
	code := m.Run()
	dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
	defer dcancel()
	if err := guest.Down(dctx); err != nil {
		fmt.Fprintf(os.Stderr, "livecore: vm down: %v\n", err)
	}
	return code
}
