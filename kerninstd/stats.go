package kerninstd

import (
	"encoding/json"
	"net/http"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
)

// StatsEvent is one line of GET /v1/cfg/stats: progress while the whole
// kernel is analysed, then the census (or an error).
type StatsEvent struct {
	Done  int        `json:"done,omitempty"`
	Total int        `json:"total,omitempty"`
	Stats *cfg.Stats `json:"stats,omitempty"`
	Error string     `json:"error,omitempty"`
}

// serveStats analyses every function of the live kernel and its modules,
// streaming progress as NDJSON.
func (d *Daemon) serveStats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(ev StatsEvent) {
		enc.Encode(ev)
		if fl != nil {
			fl.Flush()
		}
	}
	syms, err := d.reloadSymbols()
	if err != nil {
		send(StatsEvent{Error: err.Error()})
		return
	}
	progress := make(chan StatsEvent, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range progress {
			send(ev)
		}
	}()
	st, err := cfg.AnalyzeKernel(r.Context(), d.dev, syms, cfg.AnalyzeOptions{
		DriverModule: DriverModule,
		Relocatable:  codegen.CheckRelocatable,
		Prototypes:   d.prototypes(),
		Progress: func(n, total int) {
			select {
			case progress <- StatsEvent{Done: n, Total: total}:
			default: // the client is slow; skip a tick
			}
		},
	})
	close(progress)
	<-done
	if err != nil {
		send(StatsEvent{Error: err.Error()})
		return
	}
	send(StatsEvent{Stats: &st})
}
