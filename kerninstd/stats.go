package kerninstd

import (
	"encoding/json"
	"net/http"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/report"
)

// serveStats returns the whole-kernel census: the one computed at start-up
// or loaded from the cache, or (with ?fresh=1, or if there is none yet) a
// new analysis, streaming progress as NDJSON.
func (c *kernelCensus) serveStats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	send := func(ev api.StatsEvent) {
		enc.Encode(ev)
		if fl != nil {
			fl.Flush()
		}
	}
	c.mu.Lock()
	cached := c.stats
	c.mu.Unlock()
	if cached != nil && r.URL.Query().Get("fresh") == "" {
		send(api.StatsEvent{Stats: report.Census(cached)})
		return
	}
	progress := make(chan api.StatsEvent, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range progress {
			send(ev)
		}
	}()
	st, err := c.analyze(r.Context(), 0, func(n, total int) {
		select {
		case progress <- api.StatsEvent{Done: n, Total: total}:
		default: // the client is slow; skip a tick
		}
	})
	close(progress)
	<-done
	if err != nil {
		send(api.StatsEvent{Error: err.Error()})
		return
	}
	c.setStats(st)
	send(api.StatsEvent{Stats: report.Census(&st)})
}
