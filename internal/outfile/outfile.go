// Package outfile writes a command's output file (-o, --svg, --lcov,
// --pprof, a saved type graph) so that a failure leaves an existing file
// as it was: the output goes to a temporary file beside it, renamed over
// it only when the command succeeded. A reader never sees half a file, and
// `kinst count -p 999999 f -o keep.txt` keeps keep.txt.
//
// A path that names something other than a regular file (/dev/stdout, a
// FIFO, a terminal) is written directly: it cannot be replaced, and what
// reads it is already reading.
package outfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// File is an output file being written. Write to it, then Commit on
// success or Abort on failure; after either, both are no-ops.
type File struct {
	f      *os.File
	path   string // the file's final name (a symlink resolved)
	direct bool   // f is path itself: not a regular file
	mode   fs.FileMode
	done   bool
}

// Create starts the output file path. Nothing at path changes until
// Commit.
func Create(path string) (*File, error) {
	if path == "" {
		return nil, errors.New("no output file named")
	}
	final := path
	mode := fs.FileMode(0o644)
	st, err := os.Stat(path)
	switch {
	case err == nil && !st.Mode().IsRegular():
		if st.IsDir() {
			return nil, fmt.Errorf("%s: is a directory", path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
		if err != nil {
			return nil, err
		}
		return &File{f: f, path: path, direct: true}, nil
	case err == nil:
		// An existing file keeps its permissions, and a symlink stays
		// one: the file it names is replaced.
		mode = st.Mode().Perm()
		if final, err = filepath.EvalSymlinks(path); err != nil {
			return nil, err
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, err
	}
	tmp, err := os.CreateTemp(filepath.Dir(final), "."+filepath.Base(final)+".kinst-*")
	if err != nil {
		return nil, fmt.Errorf("%s: a temporary file beside it: %w", path, err)
	}
	return &File{f: tmp, path: final, mode: mode}, nil
}

// Write writes to the output.
func (o *File) Write(p []byte) (int, error) { return o.f.Write(p) }

// Name is the path the output will have.
func (o *File) Name() string { return o.path }

// Commit puts the output in place: the temporary file is synced and
// renamed over the file. An error leaves the old file as it was.
func (o *File) Commit() error {
	if o.done {
		return nil
	}
	o.done = true
	if o.direct {
		return o.f.Close()
	}
	tmp := o.f.Name()
	err := o.f.Sync()
	if cerr := o.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, o.mode)
	}
	if err == nil {
		err = os.Rename(tmp, o.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: %w", o.path, err)
	}
	return nil
}

// Abort drops the output: the file is left as it was (a device or FIFO
// written directly keeps what was written).
func (o *File) Abort() {
	if o.done {
		return
	}
	o.done = true
	o.f.Close()
	if !o.direct {
		os.Remove(o.f.Name())
	}
}

// Write writes path with write, committing only if write succeeds.
func Write(path string, write func(io.Writer) error) error {
	o, err := Create(path)
	if err != nil {
		return err
	}
	if err := write(o); err != nil {
		o.Abort()
		return fmt.Errorf("%s: %w", path, err)
	}
	return o.Commit()
}

// Finish commits o when err is nil and aborts it otherwise; it returns
// err, or the commit's error.
func (o *File) Finish(err error) error {
	if err != nil {
		o.Abort()
		return err
	}
	return o.Commit()
}

// Check finds a path Create would refuse (no such directory, a
// directory) before a long run rather than after it. "" is no file.
func Check(path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("cannot write %s: no directory %s", path, dir)
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("cannot write %s: is a directory", path)
	}
	return nil
}
