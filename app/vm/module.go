package vm

import (
	"context"

	"github.com/kinst/kinst/driver/linux"
)

// buildModule builds kerninst.ko from the embedded sources against the
// release's headers (installed first if missing), cached by a hash of
// sources and release.
func buildModule(ctx context.Context, cache, release string, say func(string, ...any)) (string, error) {
	ko, err := linux.Build(ctx, "", cache, release, say)
	if err == nil {
		return ko, nil
	}
	headers, err := ensureHeaders(ctx, release, say)
	if err != nil {
		return "", err
	}
	return linux.Build(ctx, headers, cache, release, say)
}
