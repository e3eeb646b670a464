package api

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadToken(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		os.Chmod(p, mode)
		return p
	}
	if tok, err := ReadToken(write("good", "0123456789abcdef0123\n", 0o600)); err != nil || tok != "0123456789abcdef0123" {
		t.Errorf("good token: %q, %v", tok, err)
	}
	if _, err := ReadToken(write("short", "abc\n", 0o600)); err == nil {
		t.Error("a 3-byte token was accepted")
	}
	if _, err := ReadToken(write("open", "0123456789abcdef0123\n", 0o644)); err == nil {
		t.Error("a world-readable token file was accepted")
	}
	if _, err := ReadToken(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing token file was accepted")
	}
}
