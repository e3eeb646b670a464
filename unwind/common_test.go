package unwind

import (
	"os"
	"testing"
)

// systemLibraries are the installed libraries the acceptance tests and
// golden files cover.
var systemLibraries = []struct{ name, path string }{
	{"libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"},
	{"libstdc++.so.6", "/lib/x86_64-linux-gnu/libstdc++.so.6"},
}

func existing(t testing.TB, path string) string {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Skipf("%s: %v", path, err)
	}
	return path
}
