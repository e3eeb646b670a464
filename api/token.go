package api

import (
	"fmt"
	"os"
	"strings"
)

// ReadToken reads a token file: its first line, which must be at least 16
// bytes. A file others can read is refused.
func ReadToken(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s: mode %#o lets others read it (chmod 600)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok, _, _ := strings.Cut(string(b), "\n")
	tok = strings.TrimSpace(tok)
	if len(tok) < 16 {
		return "", fmt.Errorf("token file %s: the token must be at least 16 characters", path)
	}
	return tok, nil
}
