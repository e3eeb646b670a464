// Package kerninstdtest runs a real kerninstd (its sessions, patches and
// HTTP API) over an in-memory kernel and a clock the test moves, for
// tests of what is built on the daemon: kinst's reports and the API
// client. The kernel never executes anything (Kernel.Count and
// Kernel.Time stand in for it), so it proves nothing about splicing a
// live kernel: that is the live tests' job.
package kerninstdtest

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/kerninstd"
)

// Server is a kerninstd over a Kernel, served on a loopback port.
type Server struct {
	Daemon *kerninstd.Daemon
	Kernel *Kernel
	Clock  *Clock
	HTTP   *httptest.Server
	Addr   string // host:port, as kinst's --addr takes it
	Client *api.Client
}

// Release is the test kernel's release.
const Release = "6.1.0-test-amd64"

// New starts a daemon over the test kernel (see Text); it stops with the
// test.
func New(t testing.TB) *Server {
	t.Helper()
	text, kallsyms := Text()
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(kallsyms), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{Kernel: NewKernel(TextAddr, text), Clock: NewClock()}
	d, err := kerninstd.New(kerninstd.Config{
		Device:   s.Kernel,
		Kallsyms: path,
		Release:  Release,
		Clock:    s.Clock,
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		Info: func() api.Info {
			s.Kernel.Mu.Lock()
			syncs := s.Kernel.Syncs
			s.Kernel.Mu.Unlock()
			return api.Info{ABIVersion: 5, PatchHeap: api.Addr(s.Kernel.PatchHeap()), PatchHeapSize: 1 << 20,
				CounterHeap: api.Addr(s.Kernel.CounterAddr(0)), Counters: s.Kernel.NumCounters(), DriverSyncs: syncs,
				PatchHeapUsed: s.Kernel.AllocBytes()}
		},
		// Offsets in task_struct for filters (6.1's).
		TaskLayout: func(*kernel.Symbols) (kernel.TaskLayout, error) {
			return kernel.TaskLayout{CurrentTask: 0x1fb80, PID: 0x5c8, TGID: 0x5cc, Comm: 0x7c0}, nil
		},
		Notes:   filepath.Join(t.TempDir(), "notes"),
		Modules: filepath.Join(t.TempDir(), "modules"),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.Daemon = d
	s.HTTP = httptest.NewServer(d.Handler())
	s.Addr = strings.TrimPrefix(s.HTTP.URL, "http://")
	s.Client = api.NewClient(s.Addr)
	t.Cleanup(func() {
		s.HTTP.CloseClientConnections()
		s.HTTP.Close()
		d.Close()
	})
	return s
}
