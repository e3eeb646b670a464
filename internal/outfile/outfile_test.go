package outfile

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every way a write can end, against a file that was there and one that
// was not: the file changes only when the write succeeded, and no
// temporary file is left behind.
func TestWrite(t *testing.T) {
	failed := errors.New("the command failed")
	for _, tc := range []struct {
		name    string
		before  *string // nil: no file
		write   string
		err     error
		want    *string // nil: no file
		wantErr bool
	}{
		{"new file, success", nil, "report", nil, ptr("report"), false},
		{"new file, failure", nil, "half", failed, nil, true},
		{"existing file, success", ptr("old"), "new report", nil, ptr("new report"), false},
		{"existing file, failure", ptr("keep me"), "half", failed, ptr("keep me"), true},
		{"existing file, nothing written", ptr("keep me"), "", failed, ptr("keep me"), true},
		{"existing file, empty report", ptr("old"), "", nil, ptr(""), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "out.txt")
			if tc.before != nil {
				if err := os.WriteFile(path, []byte(*tc.before), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := Write(path, func(w io.Writer) error {
				io.WriteString(w, tc.write)
				return tc.err
			})
			if (err != nil) != tc.wantErr || (tc.err != nil && !errors.Is(err, tc.err)) {
				t.Errorf("Write: %v, want error %v", err, tc.err)
			}
			b, rerr := os.ReadFile(path)
			switch {
			case tc.want == nil && rerr == nil:
				t.Errorf("file made: %q", b)
			case tc.want != nil && (rerr != nil || string(b) != *tc.want):
				t.Errorf("file holds %q (%v), want %q", b, rerr, *tc.want)
			}
			if tc.before != nil && tc.want != nil {
				// An existing file keeps its mode.
				if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
					t.Errorf("mode %v (%v), want 0600", st.Mode().Perm(), err)
				}
			}
			left, _ := os.ReadDir(dir)
			if n := len(left); n > 1 || (n == 1 && left[0].Name() != "out.txt") {
				t.Errorf("left in the directory: %v", left)
			}
		})
	}
}

func ptr(s string) *string { return &s }

// A new file gets 0644, as a report written by the shell would under the
// usual umask.
func TestNewFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new")
	if err := Write(path, func(w io.Writer) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("mode %v (%v), want 0644", st.Mode().Perm(), err)
	}
}

// A symlink stays a symlink: the file it names gets the output.
func TestSymlinkKept(t *testing.T) {
	dir := t.TempDir()
	target, link := filepath.Join(dir, "target"), filepath.Join(dir, "link")
	os.WriteFile(target, []byte("old"), 0o644)
	if err := os.Symlink("target", link); err != nil {
		t.Fatal(err)
	}
	if err := Write(link, func(w io.Writer) error { _, err := io.WriteString(w, "new"); return err }); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Errorf("link replaced: %v %v", st.Mode(), err)
	}
	if b, _ := os.ReadFile(target); string(b) != "new" {
		t.Errorf("target holds %q", b)
	}
}

// Not a regular file (a device): written in place, never replaced.
func TestDeviceWrittenDirectly(t *testing.T) {
	if err := Write(os.DevNull, func(w io.Writer) error { _, err := io.WriteString(w, "x"); return err }); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(os.DevNull); err != nil || st.Mode()&fs.ModeCharDevice == 0 {
		t.Fatalf("%s is no longer a device: %v %v", os.DevNull, st.Mode(), err)
	}
}

// Paths that cannot be written fail at Create (and Check), before any
// work is done.
func TestBadPaths(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	for _, path := range []string{
		filepath.Join(dir, "no", "such", "dir", "out"),
		dir,
		filepath.Join(file, "sub"),
	} {
		if _, err := Create(path); err == nil {
			t.Errorf("Create(%s) succeeded", path)
		}
		if err := Check(path); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("Check(%s): %v, want an error naming it", path, err)
		}
	}
	if err := Check(filepath.Join(dir, "new")); err != nil {
		t.Errorf("Check of a new file: %v", err)
	}
}
