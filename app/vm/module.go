package vm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/kinst/kinst/driver/linux"
)

// buildModule builds kerninst.ko from the embedded sources against the
// release's headers, cached by a hash of sources and release.
func buildModule(ctx context.Context, cache, release string, say func(string, ...any)) (string, error) {
	h := sha256.New()
	h.Write([]byte(release))
	err := fs.WalkDir(linux.Sources, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(linux.Sources, p)
		h.Write([]byte(p))
		h.Write(b)
		return err
	})
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "module", hex.EncodeToString(h.Sum(nil))[:16])
	ko := filepath.Join(dir, "kerninst.ko")
	if _, err := os.Stat(ko); err == nil {
		return ko, nil
	}
	headers, err := ensureHeaders(ctx, release, say)
	if err != nil {
		return "", err
	}
	say("building kerninst.ko against %s", headers)
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	if err := os.CopyFS(tmp, linux.Sources); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "make", "-C", headers, "M="+tmp, "modules")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build kerninst.ko: %v\n%s", err, out)
	}
	// Kbuild records the build directory in its outputs; only the .ko is
	// needed, so move the whole tree into place.
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", err
	}
	return ko, nil
}
