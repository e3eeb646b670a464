package linux

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
)

// LeakModule is the name of the test module Build builds beside
// kerninst.ko, in the same directory: findleaks' oracle (kinst_leak.c).
const LeakModule = "kinst_leak.ko"

// ErrNoHeaders is returned by Build when the headers directory holds no
// kernel build tree (no Makefile).
var ErrNoHeaders = errors.New("no kernel headers")

// Build builds kerninst.ko from Sources against the kernel build tree in
// headers (a /lib/modules/RELEASE/build or /usr/src/linux-headers-RELEASE)
// and returns its path. The result is kept under cacheDir/module/, named by
// a hash of the sources and key (the kernel's release or build id), so the
// module is rebuilt only when the driver or the kernel changes.
func Build(ctx context.Context, headers, cacheDir, key string, say func(string, ...any)) (string, error) {
	h := sha256.New()
	h.Write([]byte(key))
	err := fs.WalkDir(Sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(Sources, p)
		h.Write([]byte(p))
		h.Write(b)
		return err
	})
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cacheDir, "module", hex.EncodeToString(h.Sum(nil))[:16])
	ko := filepath.Join(dir, "kerninst.ko")
	if _, err := os.Stat(ko); err == nil {
		return ko, nil
	}
	if headers == "" {
		return "", fmt.Errorf("%w: no build tree given", ErrNoHeaders)
	}
	if _, err := os.Stat(filepath.Join(headers, "Makefile")); err != nil {
		return "", fmt.Errorf("%w in %s", ErrNoHeaders, headers)
	}
	if say != nil {
		say("building kerninst.ko against %s", headers)
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.CopyFS(tmp, Sources); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "make", "-C", headers, "M="+tmp, "modules")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kerninst.ko against %s: %v\n%s", headers, err, out)
	}
	if err := makeNOBITS(filepath.Join(tmp, "kerninst.ko"), heapSection); err != nil {
		return "", fmt.Errorf("build kerninst.ko: %w", err)
	}
	// Kbuild records the build directory in its outputs; only the .ko is
	// needed, so move the whole tree into place.
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return ko, nil
}
