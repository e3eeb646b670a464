package dump

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// withSize adapts a reader constructor over (io.ReaderAt, size) to the
// registry's *os.File form; the Dump then owns the file.
func withSize(open func(r io.ReaderAt, size int64, c io.Closer) (Dump, error)) func(*os.File) (Dump, error) {
	return func(f *os.File) (Dump, error) {
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		return open(f, st.Size(), f)
	}
}

// readFullAt reads len(p) bytes at off of an input of size bytes; a
// structure running past the end is corruption of the named format.
func readFullAt(r io.ReaderAt, size int64, p []byte, off int64, format, what string) error {
	if off < 0 || off > size || int64(len(p)) > size-off {
		return &CorruptError{format, off, fmt.Sprintf("%s (%d bytes) runs past the end of the %d-byte file", what, len(p), size)}
	}
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = &CorruptError{format, off, what + ": short read"}
	}
	return err
}
