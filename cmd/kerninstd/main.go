// Command kerninstd is the privileged daemon: it opens /dev/kerninst and
// serves kinst's requests over a unix socket (and, if asked, loopback TCP).
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/bpfprobe"
	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/internal/buildinfo"
	"github.com/kinst/kinst/internal/cpuquirk"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/kerninstd"
	"github.com/spf13/pflag"
)

func main() {
	fs := pflag.NewFlagSet("kerninstd", pflag.ExitOnError)
	socket := fs.String("socket", api.DefaultSocket, "unix socket `path` (mode 0600)")
	listen := fs.String("listen", "", "also serve on this TCP `address` (e.g. 127.0.0.1:7070); off by default. Whoever reaches it can splice the kernel: an address other than loopback is refused unless --token-file is given")
	tokenFile := fs.String("token-file", "", "require this `file`'s token (first line, 16+ characters, mode 0600) on the TCP listener; clients send it with KINST_TOKEN_FILE or --token-file. The unix socket needs none: it is root's only (0600)")
	metricsAddr := fs.String("metrics-listen", "", "serve Prometheus /metrics on this TCP `address` (\":9464\" binds loopback; give a host such as 0.0.0.0:9464 to expose it); off by default")
	dev := fs.String("device", "/dev/kerninst", "driver device")
	kallsyms := fs.String("kallsyms", "/proc/kallsyms", "kernel symbol table")
	allowQuirk := fs.Bool("allow-cpu-quirk", false, "splice even on a CPU with a known quirk that splicing turns into an oops (QEMU TCG before 8.0 with cmpxchg16b); for reproducing it only")
	analyze := fs.Bool("analyze", true, "analyse the whole kernel at start-up, in the background, unless the cache has it (about 1.5 s of CPU natively; a minute in an emulated guest)")
	cacheDir := fs.String("cache-dir", "/var/cache/kinst", "keep the whole-kernel analysis here, per kernel build and module set (\"\" to disable)")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	format := fs.String("log-format", "text", "text or json")
	memLimit := fs.Int64("memory-limit", 192, "soft limit on the Go heap, in `MiB`, so kerninstd stays small beside a production workload: the collector works harder as it is neared. A session that holds more live (a whole-kernel coverage session) raises it to 1.25 times its live heap, so the collector never runs without pause (0: Go's default; GOMEMLIMIT overrides)")
	version := fs.Bool("version", false, "print the build and the driver ABI it speaks, and exit")
	fs.Parse(os.Args[1:])
	if *version {
		fmt.Printf("kerninstd %s, driver ABI %d\n", buildinfo.Read(), driver.ABIVersion)
		return
	}

	if *memLimit > 0 && os.Getenv("GOMEMLIMIT") == "" {
		kerninstd.TrackMemoryLimit(context.Background(), uint64(*memLimit)<<20, time.Second)
	}
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintln(os.Stderr, "kerninstd:", err)
		os.Exit(2)
	}
	var h slog.Handler = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv})
	if *format == "json" {
		h = slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lv})
	}
	log := slog.New(h)
	var token string
	if *tokenFile != "" {
		var err error
		if token, err = api.ReadToken(*tokenFile); err != nil {
			fmt.Fprintln(os.Stderr, "kerninstd:", err)
			os.Exit(2)
		}
	}
	if *listen != "" {
		if err := kerninstd.CheckListen(*listen, token != ""); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if err := run(log, *socket, *listen, token, *metricsAddr, *dev, *kallsyms, *cacheDir, *analyze, *allowQuirk); err != nil {
		log.Error("exiting", "err", err)
		os.Exit(1)
	}
}

func run(log *slog.Logger, socket, listen, token, metricsAddr, devPath, kallsyms, cacheDir string, analyze, allowQuirk bool) error {
	// A CPU that corrupts the kernel's RFLAGS after a splice's popfq or
	// iretq: no splices, whatever the driver (cpuquirk's package doc).
	if err := cpuquirk.Check(); err != nil {
		if !allowQuirk {
			return runBPF(log, socket, listen, token, metricsAddr, kallsyms, err)
		}
		log.Warn("splicing on an affected CPU (--allow-cpu-quirk): expect the kernel to oops", "quirk", err)
	}
	dev, err := driver.Open(devPath)
	if errors.Is(err, driver.ErrNotLoaded) {
		return runBPF(log, socket, listen, token, metricsAddr, kallsyms, err)
	}
	if err != nil {
		return err
	}
	defer dev.Close()
	info, err := dev.Info()
	if err != nil {
		return err
	}
	build := buildinfo.Read().String()
	log.Info("driver open", "kerninstd", build, "abi", info.ABIVersion, "patch_heap", fmt.Sprintf("%#x", info.PatchHeap),
		"counter_heap", fmt.Sprintf("%#x", info.CounterHeap), "counters", dev.NumCounters())
	d, err := kerninstd.New(kerninstd.Config{Device: dev, Kallsyms: kallsyms, Log: log, BTF: kernel.BTFPath, CacheDir: cacheDir, Info: func() api.Info {
		in := api.Info{Version: build, ABIVersion: info.ABIVersion, PatchHeap: api.Addr(info.PatchHeap),
			PatchHeapSize: info.PatchHeapSize, CounterHeap: api.Addr(info.CounterHeap), Counters: dev.NumCounters()}
		if now, err := dev.Info(); err == nil {
			in.MaxSplices = int(now.MaxSplices)
			in.DriverSplices = int(now.Splices)
			in.Int3Hits = now.Int3Hits
			in.DriverSyncs = now.Syncs
		}
		in.PatchHeapUsed = dev.PatchHeapUsed()
		in.PeakRSS = kerninstd.PeakRSS()
		return in
	}})
	if err != nil {
		return err
	}
	return serve(log, d, socket, listen, token, metricsAddr, analyze)
}

// runBPF serves count and time with BPF where the driver is not loaded;
// where BPF cannot run either, it says so and exits.
func runBPF(log *slog.Logger, socket, listen, token, metricsAddr, kallsyms string, why error) error {
	set, err := bpfprobe.NewSet(16384)
	if err != nil {
		return fmt.Errorf("nothing here can instrument this kernel: %v, and %v; load the driver (kinst driver load), or run kerninstd where BPF is allowed (root, CONFIG_BPF_SYSCALL)", why, err)
	}
	defer set.Close()
	mechs, err := set.Available("vfs_read")
	if err != nil {
		return fmt.Errorf("nothing here can instrument this kernel: %v, and %v", why, err)
	}
	kc, err := dump.Open(dump.KcorePath)
	if err != nil {
		return fmt.Errorf("%v; BPF needs the kernel's text to resolve points, from %s: %v", why, dump.KcorePath, err)
	}
	defer kc.Close()
	mem, ok := kc.(*dump.Kcore)
	if !ok {
		return fmt.Errorf("%s is not a kcore", dump.KcorePath)
	}
	build := buildinfo.Read().String()
	log.Warn("not splicing; serving count and time with BPF (fentry, kprobe.multi or kprobe); coverage, filters and splices need the driver", "why", why, "mechanisms", strings.Join(mechs, ","))
	d, err := kerninstd.New(kerninstd.Config{Device: &kerninstd.BPFDevice{Mem: mem, Set: set}, BPF: set, NoSplice: why, Kallsyms: kallsyms, Log: log,
		BTF: kernel.BTFPath, Info: func() api.Info { return api.Info{Version: build, Counters: set.Len(), PeakRSS: kerninstd.PeakRSS()} }})
	if err != nil {
		return err
	}
	return serve(log, d, socket, listen, token, metricsAddr, false)
}

func serve(log *slog.Logger, d *kerninstd.Daemon, socket, listen, token, metricsAddr string, analyze bool) error {
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	os.Remove(socket)
	old := syscall.Umask(0o177) // the socket is born 0600: root only
	ul, err := net.Listen("unix", socket)
	syscall.Umask(old)
	if err != nil {
		return err
	}
	errc := make(chan error, 3)
	go func() { errc <- srv.Serve(ul) }()
	log.Info("serving", "socket", socket)
	if listen != "" {
		tl, err := net.Listen("tcp", listen)
		if err != nil {
			return err
		}
		tsrv := srv
		if token != "" {
			tsrv = &http.Server{Handler: kerninstd.RequireToken(srv.Handler, token), ReadHeaderTimeout: 10 * time.Second}
			defer tsrv.Close()
		}
		go func() { errc <- tsrv.Serve(tl) }()
		log.Info("serving", "tcp", tl.Addr().String(), "token", token != "")
	}
	if metricsAddr != "" {
		if strings.HasPrefix(metricsAddr, ":") {
			metricsAddr = "127.0.0.1" + metricsAddr // loopback unless a host is named
		}
		ml, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		msrv := &http.Server{Handler: d.MetricsOnlyHandler(), ReadHeaderTimeout: 10 * time.Second}
		defer msrv.Close()
		go func() { errc <- msrv.Serve(ml) }()
		log.Info("serving Prometheus metrics", "tcp", ml.Addr().String(), "path", "/metrics")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The whole-kernel analysis (no-return functions, census) loads from
	// the cache or runs in the background; requests do not wait for it.
	go d.Prepare(ctx, analyze)
	select {
	case <-ctx.Done():
		log.Info("signal; removing every splice")
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	// Remove the sessions first: that ends their sample streams, so the
	// shutdown does not wait on them.
	err = d.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	return err
}
