package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// DefaultSocket is where kerninstd listens unless told otherwise.
const DefaultSocket = "/run/kerninstd.sock"

// Client talks to kerninstd.
type Client struct {
	hc   *http.Client
	base string
	addr string
}

// NewClient returns a client for addr: a unix socket path ("/run/…" or
// "unix:/run/…") or a TCP "host:port".
func NewClient(addr string) *Client {
	if addr == "" {
		addr = DefaultSocket
	}
	c := &Client{addr: addr, base: "http://kerninstd"}
	tr := &http.Transport{}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok || strings.HasPrefix(addr, "/") {
		if !ok {
			path = addr
		}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	} else {
		c.base = "http://" + addr
	}
	c.hc = &http.Client{Transport: tr}
	return c
}

// WithToken makes every request carry "Authorization: Bearer token", as
// kerninstd's TCP listener requires when it runs with --token-file.
func (c *Client) WithToken(token string) *Client {
	if token != "" {
		c.hc.Transport = bearer{base: c.hc.Transport, token: token}
	}
	return c
}

// bearer adds the token to each request.
type bearer struct {
	base  http.RoundTripper
	token string
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// Addr is the address the client talks to.
func (c *Client) Addr() string { return c.addr }

// APIError is an error reply from kerninstd.
type APIError struct {
	Status int
	ErrorResponse
}

func (e *APIError) Error() string { return e.ErrorResponse.Error }

// ErrDaemonDied is matched by the error of a request whose connection
// kerninstd closed without an answer: it died (killed, out of memory)
// while handling it.
var ErrDaemonDied = errors.New("kerninstd closed the connection mid-request")

// closedMidRequest reports a connection that was accepted and then
// closed, or reset, before any answer: kerninstd died while handling it
// (a daemon that is not running refuses the connection instead).
func closedMidRequest(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	resp, err := c.hc.Do(req)
	if err != nil && closedMidRequest(err) {
		return fmt.Errorf("kerninstd at %s: %w: %s %s got no answer (%v); look for the OOM killer in dmesg (dmesg | grep -i oom) and at kerninstd's log; the driver restored every splice it held when its device closed",
			c.addr, ErrDaemonDied, method, path, err)
	}
	if err != nil {
		return fmt.Errorf("kerninstd at %s: %w (is kerninstd running? set --addr or KINST_ADDR)", c.addr, err)
	}
	defer resp.Body.Close()
	return decodeReply(resp, out)
}

func decodeReply(resp *http.Response, out any) error {
	if resp.StatusCode >= 300 {
		e := &APIError{Status: resp.StatusCode}
		if err := json.NewDecoder(resp.Body).Decode(&e.ErrorResponse); err != nil || e.ErrorResponse.Error == "" {
			e.ErrorResponse.Error = fmt.Sprintf("kerninstd: HTTP %d", resp.StatusCode)
		}
		return e
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(interface{ ReadJSON(io.Reader) error }); ok {
		return s.ReadJSON(resp.Body) // a coverage report, one function at a time
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (c *Client) Info(ctx context.Context) (Info, error) {
	var v Info
	return v, c.do(ctx, "GET", "/v1/info", nil, &v)
}

func (c *Client) Resolve(ctx context.Context, point string) (Resolved, error) {
	var v Resolved
	return v, c.do(ctx, "POST", "/v1/resolve", ResolveRequest{Point: point}, &v)
}

func (c *Client) CreateSession(ctx context.Context, req SessionRequest) (Session, error) {
	var v Session
	return v, c.do(ctx, "POST", "/v1/sessions", req, &v)
}

func (c *Client) RemoveSession(ctx context.Context, id string) (Session, error) {
	var v Session
	return v, c.do(ctx, "DELETE", "/v1/sessions/"+url.PathEscape(id), nil, &v)
}

// CoverReport is a running coverage session's report as of now, every
// block (a session's description carries only the totals).
func (c *Client) CoverReport(ctx context.Context, id string) (*CoverReport, error) {
	var v CoverReport
	return &v, c.do(ctx, "GET", "/v1/sessions/"+url.PathEscape(id)+"/cover", nil, &v)
}

func (c *Client) Read(ctx context.Context, at string, n int) (Memory, error) {
	var v Memory
	q := url.Values{"at": {at}, "len": {fmt.Sprint(n)}}
	return v, c.do(ctx, "GET", "/v1/read?"+q.Encode(), nil, &v)
}

func (c *Client) CFG(ctx context.Context, function string) (CFG, error) {
	var v CFG
	return v, c.do(ctx, "GET", "/v1/cfg?"+url.Values{"func": {function}}.Encode(), nil, &v)
}

// Functions finds up to limit functions whose names contain q.
func (c *Client) Functions(ctx context.Context, q string, limit int) (Functions, error) {
	var v Functions
	return v, c.do(ctx, "GET", "/v1/functions?"+url.Values{"q": {q}, "limit": {fmt.Sprint(limit)}}.Encode(), nil, &v)
}

// Calls returns a function's callers and callees; the first call may
// analyse the whole kernel.
func (c *Client) Calls(ctx context.Context, function string) (Calls, error) {
	var v Calls
	return v, c.do(ctx, "GET", "/v1/cfg/calls?"+url.Values{"func": {function}}.Encode(), nil, &v)
}

// CFGStats analyses the whole kernel, calling progress as it goes.
func (c *Client) CFGStats(ctx context.Context, progress func(done, total int)) (CFGStats, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.base+"/v1/cfg/stats", nil)
	if err != nil {
		return CFGStats{}, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return CFGStats{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return CFGStats{}, decodeReply(resp, nil)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var ev StatsEvent
		if err := dec.Decode(&ev); err != nil {
			return CFGStats{}, fmt.Errorf("cfg stats stream: %w", err)
		}
		switch {
		case ev.Error != "":
			return CFGStats{}, fmt.Errorf("cfg stats: %s", ev.Error)
		case ev.Stats != nil:
			return *ev.Stats, nil
		case progress != nil:
			progress(ev.Done, ev.Total)
		}
	}
}

func (c *Client) BenchSplice(ctx context.Context, req BenchRequest) (BenchResult, error) {
	var v BenchResult
	return v, c.do(ctx, "POST", "/v1/bench/splice", req, &v)
}

func (c *Client) BenchArm(ctx context.Context, req ArmRequest) (ArmResult, error) {
	var v ArmResult
	return v, c.do(ctx, "POST", "/v1/bench/arm", req, &v)
}

func (c *Client) BenchChurn(ctx context.Context, req ChurnRequest) (ChurnResult, error) {
	var v ChurnResult
	return v, c.do(ctx, "POST", "/v1/bench/churn", req, &v)
}

// SampleStream is an open sample stream of a session.
type SampleStream struct {
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Samples opens the session's sample stream. Closing it removes a tied
// session.
func (c *Client) Samples(ctx context.Context, id string, interval time.Duration) (*SampleStream, error) {
	req, err := http.NewRequestWithContext(ctx, "GET",
		c.base+"/v1/sessions/"+url.PathEscape(id)+"/samples?interval="+interval.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, decodeReply(resp, nil)
	}
	return &SampleStream{body: resp.Body, sc: bufio.NewScanner(resp.Body)}, nil
}

// Next blocks for the next sample. io.EOF means the session ended.
func (s *SampleStream) Next() (Sample, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return Sample{}, err
		}
		return Sample{}, io.EOF
	}
	var v Sample
	return v, json.Unmarshal(s.sc.Bytes(), &v)
}

func (s *SampleStream) Close() error { return s.body.Close() }

// WaitReady polls until kerninstd answers or timeout passes: it may be
// starting, or restarting after a crash while the driver restores text.
func (c *Client) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Info(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kerninstd did not answer within %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// Sessions lists every live session with current totals.
func (c *Client) Sessions(ctx context.Context) ([]Session, error) {
	var v []Session
	return v, c.do(ctx, "GET", "/v1/sessions", nil, &v)
}
