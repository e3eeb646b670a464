package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/procsession"
	"github.com/kinst/kinst/report"
	"github.com/kinst/kinst/web"
)

// WebOptions are kinst web's.
type WebOptions struct {
	// Listen is HOST:PORT; port 0 picks a free one.
	Listen string
	// Token is kerninstd's token: required to listen beyond loopback,
	// where every request must then carry it.
	Token string
	// Debug says where source lines come from (--vmlinux; "" looks the
	// running kernel's debug vmlinux up).
	Debug DebugOptions
	// PID, when set, serves that user process instead of the kernel: kinst
	// attaches to it and hosts its sessions itself (package procsession),
	// removing them all when it stops.
	PID int
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
	if o.PID != 0 {
		h, err := procsession.Open(o.PID, procsession.Options{Log: env.Err})
		if err != nil {
			return err
		}
		defer func() {
			if err := h.Close(); err != nil {
				fmt.Fprintf(env.Err, "kinst web: removing the process's sessions: %v\n", err)
			}
		}()
		s.Client, s.Lines = h, h.Lines
	}
	if !loopback {
		if o.Token == "" {
			return fmt.Errorf("--listen %s: %w", o.Listen, ErrWebNeedsToken)
		}
		s.Token = o.Token
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	info, err := s.Client.Info(ictx)
	cancel()
	if err != nil {
		return err
	}
	if o.PID == 0 { // a process's lines come from its own files (Host.Lines)
		if err := kernelLines(ctx, c, s, o.Debug, env); err != nil {
			return err
		}
	}
	ln, err := net.Listen("tcp", o.Listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("%w (another kinst web? --listen HOST:0 takes any free port)", err)
	}
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
	if o.PID != 0 {
		fmt.Fprintf(env.Err, "kinst web: serving %s until Ctrl-C (its sessions are removed then)\n", info.Target)
	} else {
		fmt.Fprintf(env.Err, "kinst web: serving kerninstd at %s (kernel %s, %s) until Ctrl-C\n", c.Addr(), info.KernelRelease, info.Mechanism)
	}
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

// kernelLines sets s.Lines from the running kernel's debug vmlinux, or
// says on env.Err why there are none (an error only when --vmlinux named
// one that does not serve).
func kernelLines(ctx context.Context, c *api.Client, s *web.Server, o DebugOptions, env Env) error {
	lines, err := webLines(ctx, c, o)
	if err == nil {
		s.Lines = lines
		return nil
	}
	if o.Vmlinux != "" {
		return err
	}
	var nf *debuginfo.NotFoundError
	if errors.As(err, &nf) {
		err = errors.New(nf.Brief())
	}
	fmt.Fprintf(env.Err, "kinst web: no source lines beside the instructions: %v\n", err)
	return nil
}

// webLines returns what fills a kernel function's source lines from the
// debug vmlinux of the kernel kerninstd runs: a runtime address less the
// KASLR slide is the vmlinux's. The slide is the one most of a few
// well-known functions agree on (runtime address from kerninstd, link-time
// from the vmlinux). Functions of modules get none.
func webLines(ctx context.Context, c *api.Client, o DebugOptions) (func(*api.CFG), error) {
	dbg, err := debugForDaemon(ctx, c, o)
	if err != nil {
		return nil, err
	}
	votes := map[uint64]int{}
	for _, name := range []string{"start_kernel", "schedule", "do_exit", "vfs_read", "filename_lookup"} {
		link, ok := dbg.Symbols().Addr(name)
		if !ok {
			continue
		}
		fns, err := c.Functions(ctx, name, 10)
		if err != nil {
			return nil, err
		}
		for _, f := range fns.Functions {
			if f.Name == name && f.Module == "" && f.Classic == nil {
				votes[uint64(f.Address)-link]++
			}
		}
	}
	slide, best := report.MostVoted(votes)
	if best < 2 {
		return nil, fmt.Errorf("%s does not match the running kernel (its functions are not where kerninstd finds them)", dbg.Path)
	}
	return func(cfg *api.CFG) {
		if cfg.Module != "" {
			return
		}
		// The vmlinux must have the function where the slide puts it.
		if s, off, ok := dbg.Symbols().Lookup(uint64(cfg.Address) - slide); !ok || off != 0 || s.Name != cfg.Function {
			return
		}
		report.CFGLines(cfg, dbg, slide)
	}, nil
}
