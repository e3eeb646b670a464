package cli

import (
	"bufio"
	"io"
	"text/tabwriter"
)

// table is a tabwriter that writes to its destination through a buffer:
// a tabwriter writes every cell and every run of padding on its own, one
// system call each to a terminal or a file (a coverage report of libc
// was 500,000 writes, a second of kinst cover --user's time).
type table struct {
	*tabwriter.Writer
	buf *bufio.Writer
}

// newTable is newTable(w, …) through a buffer.
func newTable(w io.Writer, minwidth, tabwidth, padding int, padchar byte, flags uint) *table {
	buf := bufio.NewWriter(w)
	return &table{Writer: tabwriter.NewWriter(buf, minwidth, tabwidth, padding, padchar, flags), buf: buf}
}

// Flush writes the table's rows, aligned, and then the buffer.
func (t *table) Flush() error {
	if err := t.Writer.Flush(); err != nil {
		return err
	}
	return t.buf.Flush()
}

// nameWidth is the widest a function's name is printed in a table
// column.
const nameWidth = 80

// cell shortens a name for a table column, keeping its start and end
// with "…" between: a demangled C++ or Rust name can run to a thousand
// characters (generic arguments), and an aligned column pads every row
// to its widest. Reports that are read by programs (--json) and lines
// of their own keep names whole.
func cell(name string) string {
	r := []rune(name)
	if len(r) <= nameWidth {
		return name
	}
	head := (nameWidth - 1) / 2
	return string(r[:head]) + "…" + string(r[len(r)-(nameWidth-1-head):])
}
