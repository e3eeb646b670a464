package cli

import "testing"

// FILE:LINE is told apart from the other points that hold a colon:
// FUNC:BLOCK, with function names that hold dots.
func TestParseSourceLine(t *testing.T) {
	for _, tc := range []struct {
		in   string
		file string
		line int
		ok   bool
	}{
		{"fs/stat.c:213", "fs/stat.c", 213, true},
		{"stat.c:1", "stat.c", 1, true},
		{"include/linux/fs.h:40", "include/linux/fs.h", 40, true},
		{"arch/x86/entry/entry_64.S:100", "arch/x86/entry/entry_64.S", 100, true},
		{"rust/kernel/lib.rs:7", "rust/kernel/lib.rs", 7, true},
		{"main.go:13", "main.go", 13, true},
		{"src/x.hpp:9", "src/x.hpp", 9, true},
		{"main.load:2", "", 0, false},
		{"fs/stat.c:0", "", 0, false},
		{"fs/stat.c:", "", 0, false},
		{"fs/stat.c:12a", "", 0, false},
		{"vfs_read:3", "", 0, false},
		{"evdev_connect.cold:2", "", 0, false},
		{"foo.isra.0:1", "", 0, false},
		{"foo.constprop.0:4", "", 0, false},
		{"vfs_read+0x10", "", 0, false},
		{"lookuppn", "", 0, false},
	} {
		file, line, ok := ParseSourceLine(tc.in)
		if file != tc.file || line != tc.line || ok != tc.ok {
			t.Errorf("%q: %q %d %v, want %q %d %v", tc.in, file, line, ok, tc.file, tc.line, tc.ok)
		}
	}
}

func TestParseRelativeLine(t *testing.T) {
	for _, tc := range []struct {
		in string
		fn string
		n  int
		ok bool
	}{
		{"vfs_statx:+7", "vfs_statx", 7, true},
		{"vfs_statx:+0", "vfs_statx", 0, true},
		{"evdev_connect.cold:+2", "evdev_connect.cold", 2, true},
		{"vfs_statx:7", "", 0, false},
		{"vfs_statx+7", "", 0, false},
		{"vfs_statx:+", "", 0, false},
		{"fs/stat.c:+3", "", 0, false},
		{":+3", "", 0, false},
	} {
		fn, n, ok := ParseRelativeLine(tc.in)
		if fn != tc.fn || n != tc.n || ok != tc.ok {
			t.Errorf("%q: %q %d %v, want %q %d %v", tc.in, fn, n, ok, tc.fn, tc.n, tc.ok)
		}
		if IsLinePoint(tc.in) != tc.ok {
			t.Errorf("IsLinePoint(%q) = %v", tc.in, !tc.ok)
		}
	}
}

func TestSplitModule(t *testing.T) {
	for _, c := range []struct{ in, mod, rest string }{
		{"ext4:fs/ext4/inode.c:120", "ext4", "fs/ext4/inode.c:120"},
		{"kinst_leak:kinst_leak.c:55", "kinst_leak", "kinst_leak.c:55"},
		{"fs/stat.c:192", "", "fs/stat.c:192"},
		{"vfs_statx:+3", "", "vfs_statx:+3"},
		{"vfs_statx", "", "vfs_statx"},
		{"a/b:c.c:1", "", "a/b:c.c:1"}, // a directory with a colon is a path, not a module
	} {
		mod, rest := splitModule(c.in)
		if mod != c.mod || rest != c.rest {
			t.Errorf("splitModule(%q) = %q, %q; want %q, %q", c.in, mod, rest, c.mod, c.rest)
		}
	}
}
