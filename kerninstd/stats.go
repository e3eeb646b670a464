package kerninstd

import (
	"encoding/json"
	"net/http"

	"github.com/kinst/kinst/census"
)

// StatsEvent is one line of GET /v1/cfg/stats: progress while the whole
// kernel is analysed, then the census (or an error).
type StatsEvent struct {
	Done  int           `json:"done,omitempty"`
	Total int           `json:"total,omitempty"`
	Stats *census.Stats `json:"stats,omitempty"`
	Error string        `json:"error,omitempty"`
}

// serveStats returns the whole-kernel census: the one computed at start-up
// or loaded from the cache, or (with ?fresh=1, or if there is none yet) a
// new analysis, streaming progress as NDJSON.
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
	d.anMu.Lock()
	cached := d.stats
	d.anMu.Unlock()
	if cached != nil && r.URL.Query().Get("fresh") == "" {
		send(StatsEvent{Stats: cached})
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
	st, err := d.analyze(r.Context(), 0, func(n, total int) {
		select {
		case progress <- StatsEvent{Done: n, Total: total}:
		default: // the client is slow; skip a tick
		}
	})
	close(progress)
	<-done
	if err != nil {
		send(StatsEvent{Error: err.Error()})
		return
	}
	d.setStats(st)
	send(StatsEvent{Stats: &st})
}
