package cli

import (
	"encoding/json"
	"io"

	"github.com/kinst/kinst/api"
)

// writeJSON prints v as indented JSON: the form of every --json report.
func writeJSON(w io.Writer, v any) error {
	switch v := v.(type) {
	case api.CoverReport:
		return v.WriteJSON(w, true) // one function at a time: a whole kernel's is over 100 MB
	case *api.CoverReport:
		return v.WriteJSON(w, true)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// mapSlice converts every element of s with f. A nil s stays nil, so a
// report's JSON keeps null where it had null and [] where it had [].
func mapSlice[T, U any](s []T, f func(T) U) []U {
	if s == nil {
		return nil
	}
	out := make([]U, len(s))
	for i, v := range s {
		out[i] = f(v)
	}
	return out
}
