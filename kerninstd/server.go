package kerninstd

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/kerninstd/bench"
	"github.com/kinst/kinst/metrics"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// maxRead bounds one /v1/read.
const maxRead = 1 << 20

// Handler returns the HTTP API.
func (d *Daemon) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/info", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.Info())
	})
	mux.HandleFunc("POST /v1/resolve", postJSON(http.StatusOK, func(_ *http.Request, req api.ResolveRequest) (api.Resolved, error) {
		res, err := d.Resolve(req.Point)
		if err != nil {
			return res, &splice.PointError{Point: req.Point, Err: err}
		}
		return res, nil
	}))
	mux.HandleFunc("POST /v1/sessions", postJSON(http.StatusCreated, func(r *http.Request, req api.SessionRequest) (api.Session, error) {
		s, err := d.CreateSession(req)
		if err != nil || !req.Tied {
			return s, err
		}
		// A tied session ends with its client's sample stream. A client
		// gone while the session was made (killed while a whole
		// kernel's coverage armed) never opens one: its session would
		// outlive it, as one did. Removed at once, and, should the
		// client go between this answer and its stream, after a grace.
		if r.Context().Err() != nil {
			d.removeUnclaimed(s.ID, "client gone while the session was made")
			return api.Session{}, fmt.Errorf("the client went away while session %s was made: removed", s.ID)
		}
		d.claimWithin(s.ID, TiedGrace)
		return s, nil
	}))
	mux.HandleFunc("DELETE /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		s, err := d.RemoveSession(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, s)
		if s.Cover != nil {
			// The final report was the last of a big session's memory.
			releaseHeapAfter(s.Cover.Armed)
		}
	})
	mux.HandleFunc("GET /v1/sessions/{id}/samples", d.serveSamples)
	mux.HandleFunc("GET /v1/sessions/{id}/cover", func(w http.ResponseWriter, r *http.Request) {
		rep, err := d.CoverReport(r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, rep)
	})
	mux.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, d.Sessions())
	})
	mux.Handle("GET /metrics", metricsHandler(d))
	// Go's profiles of kerninstd itself (heap, CPU, goroutines), behind
	// the same token as the rest: how a planner's memory or time is found.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /v1/read", serveRead(d.dev, d.plan.Symbols))
	mux.HandleFunc("GET /v1/functions", serveFunctions(d.plan.Symbols))
	mux.HandleFunc("GET /v1/cfg/stats", d.an.serveStats)
	mux.HandleFunc("GET /v1/cfg/calls", func(w http.ResponseWriter, r *http.Request) {
		c, err := d.an.functionCalls(r.Context(), r.URL.Query().Get("func"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	mux.HandleFunc("GET /v1/cfg", func(w http.ResponseWriter, r *http.Request) {
		c, err := d.FunctionCFG(r.URL.Query().Get("func"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, c)
	})
	mux.HandleFunc("POST /v1/bench/splice", postJSON(http.StatusOK, func(r *http.Request, req api.BenchRequest) (api.BenchResult, error) {
		return bench.Splice(r.Context(), benchKernel(d), req)
	}))
	mux.HandleFunc("POST /v1/bench/arm", postJSON(http.StatusOK, func(r *http.Request, req api.ArmRequest) (api.ArmResult, error) {
		res, err := bench.Arm(r.Context(), benchKernel(d), req)
		// Planning and arming leave as much garbage as they held.
		releaseHeapAfter(res.Armed)
		return res, err
	}))
	mux.HandleFunc("POST /v1/bench/churn", postJSON(http.StatusOK, func(r *http.Request, req api.ChurnRequest) (api.ChurnResult, error) {
		return bench.Churn(r.Context(), benchKernel(d), req)
	}))
	return mux
}

// postJSON is the handler of a POST whose body is a Req: f's answer is
// written with status, or its error as an ErrorResponse.
func postJSON[Req, Res any](status int, f func(r *http.Request, req Req) (Res, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !readJSON(w, r, &req) {
			return
		}
		res, err := f(r, req)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, status, res)
	}
}

// serveSamples streams one Sample per interval until the client goes away
// or the session is removed. For a tied session, the client going away
// removes the session: its splices never outlive the kinst that asked.
func (d *Daemon) serveSamples(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	interval := time.Second
	if v := r.URL.Query().Get("interval"); v != "" {
		iv, err := time.ParseDuration(v)
		if err != nil || iv < 10*time.Millisecond {
			writeError(w, badRequest(fmt.Errorf("interval %q: want a duration ≥ 10ms", v)))
			return
		}
		interval = iv
	}
	d.mu.Lock()
	ss := d.findLocked(id)
	ok := ss != nil
	var slots []int
	var timers []*timedFunc
	if ok {
		ss.streamed = true
		id = ss.id
		for _, r := range ss.reqs {
			slots = append(slots, r.Counter())
		}
		for _, c := range ss.bpf {
			slots = append(slots, c.slot)
		}
		timers = append(timers, ss.timers...)
	}
	d.mu.Unlock()
	if !ok {
		writeError(w, fmt.Errorf("%w %q", ErrNoSession, id))
		return
	}
	if ss.tied {
		defer func() {
			select {
			case <-ss.done:
				return
			default:
			}
			d.log.Info("client gone; removing tied session", "session", id)
			if _, err := d.RemoveSession(id); err != nil && !errors.Is(err, ErrNoSession) {
				d.log.Error("remove tied session", "session", id, "err", err)
			}
		}()
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	if fl != nil {
		fl.Flush()
	}
	set := metrics.NewCounterSet(d.dev, slots)
	tick, stop := d.clock.NewTicker(interval)
	defer stop()
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case <-ss.done:
			return
		case now := <-tick:
			s := set.Sample(now)
			out := api.Sample{Time: s.Time, Totals: s.Totals, Deltas: s.Deltas}
			for _, t := range timers {
				out.Timers = append(out.Timers, api.Totals(d.tm.timerPoint(t, now)))
			}
			if err := enc.Encode(out); err != nil {
				return
			}
			if fl != nil {
				fl.Flush()
			}
		}
	}
}

func serveRead(dev engine.Device, syms func() *kernel.Symbols) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		at := r.URL.Query().Get("at")
		n := 64
		if v := r.URL.Query().Get("len"); v != "" {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n <= 0 || n > maxRead {
				writeError(w, badRequest(fmt.Errorf("len %q: want 1..%d", v, maxRead)))
				return
			}
		}
		addr, err := parseLocation(syms(), at)
		if err != nil {
			writeError(w, err)
			return
		}
		b := make([]byte, n)
		if err := dev.Read(addr, b); err != nil {
			writeError(w, err)
			return
		}
		m := api.Memory{Address: api.Addr(addr), Bytes: hex.EncodeToString(b)}
		if sym, off, ok := syms().At(addr); ok {
			m.Symbol = fmt.Sprintf("%s+%#x", sym.Name, off)
		}
		writeJSON(w, http.StatusOK, m)
	}
}

// parseLocation accepts 0xADDR, a hex address without 0x, or SYM[+OFF].
func parseLocation(syms *kernel.Symbols, at string) (uint64, error) {
	if at == "" {
		return 0, badRequest(errors.New("missing address: want ADDR or SYM[+0xOFF]"))
	}
	if v, err := strconv.ParseUint(strings.TrimPrefix(at, "0x"), 16, 64); err == nil && (strings.HasPrefix(at, "0x") || len(at) == 16) {
		return v, nil
	}
	p, err := splice.ParsePoint(at)
	if err != nil {
		return 0, badRequest(err)
	}
	if a, ok := syms.Address(p.Function); ok {
		return a + p.Offset, nil // includes kept data markers such as __start___ex_table
	}
	sym, _, err := syms.Lookup(p.Function)
	if err != nil {
		return 0, err
	}
	return sym.Addr + p.Offset, nil
}

type badRequestError struct{ error }

func (e badRequestError) Unwrap() error { return e.error }

func badRequest(err error) error { return badRequestError{err} }

// errorCode classifies an error for API clients.
func errorCode(err error) (int, string) {
	var br badRequestError
	switch {
	case errors.Is(err, kernel.ErrUnknownFunction):
		return http.StatusNotFound, api.CodeUnknownFunction
	case errors.Is(err, cfg.ErrNotBoundary):
		return http.StatusUnprocessableEntity, api.CodeNotBoundary
	case errors.Is(err, springboard.ErrTooShort), errors.Is(err, splice.ErrNoEntryInstruction):
		return http.StatusUnprocessableEntity, api.CodeTooShort
	case errors.Is(err, splice.ErrNoSplice), errors.Is(err, cfg.ErrFreedInit):
		return http.StatusUnprocessableEntity, api.CodeNoSplice
	case errors.Is(err, ErrNoSession):
		return http.StatusNotFound, api.CodeNoSession
	case errors.As(err, &br), errors.Is(err, splice.ErrBadPoint), errors.Is(err, bench.ErrBadRequest):
		return http.StatusBadRequest, api.CodeBadRequest
	case errors.Is(err, syscall.EFAULT):
		return http.StatusUnprocessableEntity, api.CodeFault
	}
	return http.StatusInternalServerError, api.CodeInternal
}

func writeError(w http.ResponseWriter, err error) {
	status, code := errorCode(err)
	resp := api.ErrorResponse{Error: err.Error(), Code: code}
	var pe *splice.PointError
	if errors.As(err, &pe) {
		resp.Point = pe.Point
	}
	writeJSON(w, status, resp)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// A coverage report is streamed, compact, one function at a time:
	// whole-kernel reports are over 100 MB of JSON.
	switch v := v.(type) {
	case api.Session:
		if v.Cover != nil {
			v.WriteJSON(w)
			return
		}
	case *api.CoverReport:
		v.WriteJSON(w, false)
		return
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, badRequest(fmt.Errorf("request body: %w", err)))
		return false
	}
	return true
}
