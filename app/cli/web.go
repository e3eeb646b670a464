package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/web"
)

// WebOptions are kinst web's.
type WebOptions struct {
	// Listen is HOST:PORT; port 0 picks a free one.
	Listen string
	// Token is kerninstd's token: required to listen beyond loopback,
	// where every request must then carry it.
	Token string
}

// ErrWebNeedsToken is matched when kinst web is asked to listen beyond
// loopback without kerninstd's token.
var ErrWebNeedsToken = errors.New("listening beyond loopback needs kerninstd's token (--token-file)")

// Web serves the web view (package web) until ctx ends: it checks that
// kerninstd answers, listens, and prints the URL as the first line of
// env.Out (with ?token= when a token guards it).
func Web(ctx context.Context, c *api.Client, o WebOptions, env Env) error {
	host, _, err := net.SplitHostPort(o.Listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", o.Listen, err)
	}
	loopback := host == "localhost"
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		loopback = true
	}
	s := &web.Server{Client: c}
	if !loopback {
		if o.Token == "" {
			return fmt.Errorf("--listen %s: %w", o.Listen, ErrWebNeedsToken)
		}
		s.Token = o.Token
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	info, err := c.Info(ictx)
	cancel()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return err
	}
	if loopback {
		// Only this address by its own names: a page of another site
		// whose name resolves here (DNS rebinding) is refused.
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		s.Hosts = []string{ln.Addr().String(), "localhost:" + port, "127.0.0.1:" + port, "[::1]:" + port}
	}
	u := url.URL{Scheme: "http", Host: ln.Addr().String(), Path: "/"}
	if s.Token != "" {
		u.RawQuery = url.Values{"token": {s.Token}}.Encode()
	}
	fmt.Fprintln(env.Out, u.String())
	fmt.Fprintf(env.Err, "kinst web: serving kerninstd at %s (kernel %s, %s) until Ctrl-C\n", c.Addr(), info.KernelRelease, info.Mechanism)
	srv := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
		return nil
	}
}
