// Package web serves kinst's web view: a page of the running kernel's
// code (modules and functions, a function's control-flow graph with its
// instructions) on which counters, timers and coverage sessions are put
// by clicking, with their values drawn live. The page's assets are
// embedded (the layout and plot libraries vendored from npm, see
// assets/vendor/MANIFEST); everything it knows comes from kerninstd's
// public API through this server, so a session made on the page is a
// session like the CLI's (kinst ls lists it, kinst detach ends it).
package web

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kinst/kinst/api"
)

//go:embed assets
var assets embed.FS

// Backend is what the page's API asks: kerninstd's client (*api.Client)
// for the kernel, or sessions kinst hosts itself over a user process
// (procsession.Host). Errors that carry an HTTP status (api.APIError, or
// an HTTPStatus method) answer with it.
type Backend interface {
	Info(ctx context.Context) (api.Info, error)
	Functions(ctx context.Context, q string, limit int) (api.Functions, error)
	CFG(ctx context.Context, function string) (api.CFG, error)
	Sessions(ctx context.Context) ([]api.Session, error)
	CreateSession(ctx context.Context, req api.SessionRequest) (api.Session, error)
	RemoveSession(ctx context.Context, id string) (api.Session, error)
	CoverReport(ctx context.Context, id string) (*api.CoverReport, error)
}

// Server is the web view's HTTP server.
type Server struct {
	// Client answers the page's API: kerninstd, or a process's sessions.
	Client Backend
	// Token, when set, is required of every request: as the cookie the
	// page's first URL (?token=) sets, or as a bearer token. kinst web
	// sets it when it listens beyond loopback.
	Token string
	// Hosts, when set, are the only Host headers served (the listening
	// address by IP and as localhost): a page of another site whose name
	// was made to resolve to 127.0.0.1 (DNS rebinding) is refused.
	Hosts []string
	// Lines, when set, fills the source lines of a function's
	// instructions (api.CFGInstruction.Line) before the page gets it.
	Lines func(cfg *api.CFG)
	// Interval is how often /api/events sends the sessions; default 1s.
	Interval time.Duration
	Log      *slog.Logger
}

// csrfHeader carries the page's token on every request that changes the
// kernel; csrfMeta is where the page finds it.
const (
	csrfHeader = "X-Kinst-Csrf"
	csrfMeta   = `<meta name="kinst-csrf" content="">`
)

// tokenCookie carries Token once the page's first URL has given it.
const tokenCookie = "kinst_token"

// Handler serves the page, its assets and its API.
//
// A request that changes the kernel (POST, DELETE) must carry the token
// written into the page (a fresh one per Handler: only a page read from
// this server, which another site's script cannot read, has it), send
// JSON, and come from this server's origin, so that no other site can
// splice through a user's browser.
func (s *Server) Handler() http.Handler {
	csrf := randomToken()
	mux := http.NewServeMux()
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	page := func(w http.ResponseWriter, r *http.Request) {
		b, err := fs.ReadFile(static, "index.html")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b = bytes.Replace(b, []byte(csrfMeta), []byte(`<meta name="kinst-csrf" content="`+csrf+`">`), 1)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.Write(b)
	}
	mux.HandleFunc("GET /{$}", page)
	mux.HandleFunc("GET /fn/{name...}", page)
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(static)))

	s.routeAPI(mux)
	mux.HandleFunc("GET /api/events", s.serveEvents)
	return s.checkHost(s.authorize(sameOrigin(csrf, mux)))
}

// routeAPI adds the page's API: each answer is the backend's, as JSON.
func (s *Server) routeAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /api/info", s.get(func(ctx context.Context, r *http.Request) (any, error) {
		return s.Client.Info(ctx)
	}))
	mux.HandleFunc("GET /api/functions", s.get(func(ctx context.Context, r *http.Request) (any, error) {
		limit := 50
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, badRequest(fmt.Errorf("limit %q: not a number", v))
			}
			limit = n
		}
		return s.Client.Functions(ctx, r.URL.Query().Get("q"), limit)
	}))
	mux.HandleFunc("GET /api/cfg", s.get(func(ctx context.Context, r *http.Request) (any, error) {
		name := r.URL.Query().Get("func")
		if name == "" {
			return nil, badRequest(errors.New("which function? (?func=NAME)"))
		}
		cfg, err := s.Client.CFG(ctx, name)
		if err == nil && s.Lines != nil {
			s.Lines(&cfg)
		}
		return cfg, err
	}))
	mux.HandleFunc("GET /api/sessions", s.get(func(ctx context.Context, r *http.Request) (any, error) {
		return s.Client.Sessions(ctx)
	}))
	mux.HandleFunc("POST /api/sessions", func(w http.ResponseWriter, r *http.Request) {
		var req api.SessionRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
			writeError(w, badRequest(fmt.Errorf("session request: %w", err)))
			return
		}
		if req.Tied {
			// A tied session ends with its sample stream, which the page
			// does not hold: it would be removed at once.
			writeError(w, badRequest(errors.New("the page makes untied sessions (it ends them with DELETE)")))
			return
		}
		ss, err := s.Client.CreateSession(r.Context(), req)
		if err != nil {
			writeError(w, err)
			return
		}
		s.log().Info("session made from the page", "session", ss.ID, "name", ss.Name)
		writeJSON(w, http.StatusCreated, ss)
	})
	mux.HandleFunc("DELETE /api/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		ss, err := s.Client.RemoveSession(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, ss)
	})
	mux.HandleFunc("GET /api/sessions/{id}/cover", s.get(func(ctx context.Context, r *http.Request) (any, error) {
		return s.Client.CoverReport(ctx, r.PathValue("id"))
	}))
}

// randomToken is 128 random bits in hex.
func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b)
}

// checkHost refuses a Host header not in s.Hosts (when set).
func (s *Server) checkHost(next http.Handler) http.Handler {
	if len(s.Hosts) == 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(s.Hosts, strings.ToLower(r.Host)) {
			http.Error(w, fmt.Sprintf("kinst web: host %q is not this server's (%s)", r.Host, strings.Join(s.Hosts, ", ")), http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sameOrigin lets a request that changes something (any method but GET
// and HEAD) through only with the page's token, a JSON body (for POST)
// and, where the browser says where it comes from, this origin.
func sameOrigin(csrf string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet || r.Method == http.MethodHead {
			next.ServeHTTP(w, r)
			return
		}
		refuse := func(why string) {
			writeJSON(w, http.StatusForbidden, api.ErrorResponse{Error: "kinst web: " + why})
		}
		if o := r.Header.Get("Origin"); o != "" {
			u, err := url.Parse(o)
			if err != nil || u.Host != r.Host {
				refuse(fmt.Sprintf("a request from %s, not this page", o))
				return
			}
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
			refuse("a request from another site (" + site + ")")
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(csrf)) != 1 {
			refuse("a change without the page's token (" + csrfHeader + ")")
			return
		}
		if r.Method == http.MethodPost && !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			refuse("a change must send application/json")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) log() *slog.Logger {
	if s.Log != nil {
		return s.Log
	}
	return slog.Default()
}

// authorize lets a request through when no token is set, or when it
// carries the token (cookie or bearer); a page URL with ?token= sets the
// cookie.
func (s *Server) authorize(next http.Handler) http.Handler {
	if s.Token == "" {
		return next
	}
	ok := func(got string) bool { return subtle.ConstantTimeCompare([]byte(got), []byte(s.Token)) == 1 }
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t := r.URL.Query().Get("token"); t != "" && ok(t) {
			http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: t, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			next.ServeHTTP(w, r)
			return
		}
		if c, err := r.Cookie(tokenCookie); err == nil && ok(c.Value) {
			next.ServeHTTP(w, r)
			return
		}
		if b, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && ok(b) {
			next.ServeHTTP(w, r)
			return
		}
		http.Error(w, "kinst web: this address needs kerninstd's token (open the URL kinst web printed)", http.StatusUnauthorized)
	})
}

// get serves f's answer as JSON.
func (s *Server) get(f func(ctx context.Context, r *http.Request) (any, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := f(r.Context(), r)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, v)
	}
}

// Event is what /api/events sends each interval: every session (its
// probes' counts, timers' totals and coverage totals), and, when the page
// asked for one (?cover=ID), that coverage session's blocks.
type Event struct {
	Time     time.Time        `json:"time"`
	Sessions []api.Session    `json:"sessions"`
	Cover    *api.CoverReport `json:"cover,omitempty"`
	Error    string           `json:"error,omitempty"`
}

// serveEvents streams an Event every interval as server-sent events,
// until the page goes.
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	cover := r.URL.Query().Get("cover")
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	interval := s.Interval
	if interval <= 0 {
		interval = time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		ev := Event{Time: time.Now()}
		ss, err := s.Client.Sessions(r.Context())
		if err != nil {
			ev.Error = err.Error()
		}
		ev.Sessions = ss
		if cover != "" && err == nil {
			if rep, err := s.Client.CoverReport(r.Context(), cover); err == nil {
				ev.Cover = rep
			} else {
				ev.Error = err.Error()
			}
		}
		b, _ := json.Marshal(ev)
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return
		}
		fl.Flush()
		select {
		case <-r.Context().Done():
			return
		case <-t.C:
		}
	}
}

// badRequestError is an error of the page's request itself.
type badRequestError struct{ error }

func badRequest(err error) error { return badRequestError{err} }

// writeError answers with err as api.ErrorResponse, with kerninstd's
// status where it gave one.
func writeError(w http.ResponseWriter, err error) {
	status := http.StatusBadGateway
	var ae *api.APIError
	var br badRequestError
	var se interface{ HTTPStatus() int }
	switch {
	case errors.As(err, &ae):
		writeJSON(w, ae.Status, ae.ErrorResponse)
		return
	case errors.As(err, &br):
		status = http.StatusBadRequest
	case errors.As(err, &se):
		status = se.HTTPStatus()
	}
	writeJSON(w, status, api.ErrorResponse{Error: err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
