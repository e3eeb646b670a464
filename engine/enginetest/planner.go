package enginetest

import (
	"io"
	"log/slog"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// Planner is a planner over text (an engine's text view) and heap (its
// springboards), with the symbols of the kallsyms file at path, as the
// daemon wires them.
func Planner(text cfg.TextReader, heap *springboard.Heap, path string) (*splice.Planner, error) {
	view, err := kernel.Live(text, kernel.LiveOptions{Kallsyms: path})
	if err != nil {
		return nil, err
	}
	return splice.New(splice.Config{Kernel: view, Springboards: heap, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
}
