package vfs

import "testing"

func TestFileType(t *testing.T) {
	for mode, want := range map[uint64]string{0o100644: "REG", 0o40755: "DIR", 0o20666: "CHR", 0o60660: "BLK", 0o10600: "FIFO", 0o140777: "SOCK", 0o120777: "LNK", 0: "?"} {
		if got := fileType(mode); got != want {
			t.Errorf("mode %o: %s, want %s", mode, got, want)
		}
	}
}
