package cli

import (
	"encoding/json"
	"io"
)

// writeJSON prints v as indented JSON: the form of every --json report.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
