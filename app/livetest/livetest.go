// Package livetest boots the test VM for a package of live tests: the
// stock Debian kernel under QEMU with kerninst.ko loaded and kerninstd
// running, one VM for the whole package, torn down at the end.
//
// Environment: the package runs only with KINST_LIVE=1 (make test sets
// it; a plain go test skips it and says so); KINST_BIN names prebuilt
// static binaries (else they are built); KINST_CACHE is the
// download/build cache.
package livetest

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/vm"
)

// VM is a booted guest.
type VM struct {
	*vm.Instance
	Client  *api.Client // kerninstd in the guest, through the port forward
	Bin     string      // directory holding the kinst and kerninstd the guest runs
	Cache   string      // KINST_CACHE: the kernel package, its vmlinux, the module
	Scratch string      // this run's temporary directory, removed at the end
}

// Options tune the package's VM.
type Options struct {
	// Accel is vm.Config.Accel: "" (auto), "tcg", "tcg-single" or "kvm".
	// Packages whose tests make the kernel patch its own text (tracefs
	// kprobes, static keys flipped by enabling trace events) use
	// "tcg-single": under multi-threaded TCG a vCPU can keep running a
	// stale translation of the kernel's transient int3 for ever.
	Accel string
	// NoDriver boots without kerninst.ko (vm.Config.NoDriver): kerninstd
	// serves count and time with BPF.
	NoDriver bool
	// Kernel is the Debian kernel to boot (vm.Config.KernelPackage);
	// "": KINST_KERNEL, else the default.
	Kernel string
	// CPU is vm.Config.CPU: the guest CPU model under TCG ("": the default,
	// without cx16).
	CPU string
	// Append is vm.Config.Append: more of the guest kernel's command line.
	Append string
}

// Enabled reports whether live-VM tests run: only when KINST_LIVE=1.
func Enabled() bool { return os.Getenv("KINST_LIVE") == "1" }

// Main boots a VM, hands it to ready, runs the package's tests, and stops
// the VM. It returns the exit code for os.Exit. VMs left by a test process
// that died (a panic skips the teardown) are stopped first.
func Main(m *testing.M, name string, ready func(*VM)) int {
	return MainWith(m, name, Options{}, ready)
}

// MainWith is Main with options for the VM.
func MainWith(m *testing.M, name string, o Options, ready func(*VM)) int {
	if !Enabled() {
		fmt.Printf("%s: skipping the live-VM tests (they boot a VM; set KINST_LIVE=1 to run them, as make test does)\n", name)
		return 0
	}
	reapStaleVMs()
	g, down, err := Boot(name, o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	ready(g)
	stop := watchCounters(name, g.Client)
	code := m.Run()
	stop()
	if err := countersClean(g.Client); err != nil {
		fmt.Fprintf(os.Stderr, "%s: after every test: %v\n", name, err)
		code = 1
	}
	if code != 0 {
		if b, err := os.ReadFile(g.SerialLog()); err == nil {
			fmt.Fprintf(os.Stderr, "%s: serial log tail:\n%s\n", name, Tail(string(b), 40))
		}
	}
	down()
	return code
}

// Boot boots a VM with o (and KINST_KERNEL unless o.Kernel is set) and
// returns it with the function that stops it and removes its files.
// Packages that boot several VMs in turn (one per kernel) call it from
// their tests; MainWith calls it once for the package.
func Boot(name string, o Options) (*VM, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tmp, err := os.MkdirTemp("", "kinst-live-")
	if err != nil {
		return nil, nil, err
	}
	// Whose VM this is: a later run reaps it if this process dies.
	os.WriteFile(filepath.Join(tmp, "owner.pid"), []byte(fmt.Sprint(os.Getpid())), 0o600)
	bin := os.Getenv("KINST_BIN")
	if bin == "" {
		bin = filepath.Join(tmp, "bin")
		for _, c := range []string{"kinst", "kerninstd"} {
			cmd := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(bin, c), "./cmd/"+c)
			cmd.Dir, cmd.Env = RepoRoot(), append(os.Environ(), "CGO_ENABLED=0")
			if b, err := cmd.CombinedOutput(); err != nil {
				os.RemoveAll(tmp)
				return nil, nil, fmt.Errorf("build %s: %v\n%s", c, err, b)
			}
		}
	}
	cache := os.Getenv("KINST_CACHE")
	if cache == "" {
		cache = filepath.Join(RepoRoot(), ".cache")
	}
	kernel := o.Kernel
	if kernel == "" {
		kernel = os.Getenv("KINST_KERNEL") // default: the machine's linux-image-amd64
	}
	start := time.Now()
	c := vm.Config{
		CacheDir:      cache,
		StateDir:      filepath.Join(tmp, "vm"),
		KinstBin:      filepath.Join(bin, "kinst"),
		KerninstdBin:  filepath.Join(bin, "kerninstd"),
		Accel:         o.Accel,
		NoDriver:      o.NoDriver,
		Append:        o.Append,
		CPU:           o.CPU,
		KernelPackage: kernel,
		Progress:      os.Stderr,
		Ready: func(ctx context.Context, in *vm.Instance) error {
			c, err := in.Client()
			if err != nil {
				return err
			}
			return c.WaitReady(ctx, 2*time.Minute)
		},
	}
	in, err := vm.Up(ctx, c)
	if err != nil && diedBeforeInit(c.StateDir) {
		// The kernel died before running /init, so before any of kinst
		// ran: under multi-threaded TCG a vCPU can execute a stale
		// translation of code the kernel patched at boot (seen once in
		// tens of boots). Boot once more, and say so.
		fmt.Fprintf(os.Stderr, "%s: the guest kernel died before /init (serial log tail below); booting once more\n%s\n",
			name, Tail(readFile(filepath.Join(c.StateDir, "serial.log")), 12))
		in, err = vm.Up(ctx, c)
	}
	if err != nil {
		os.RemoveAll(tmp)
		return nil, nil, fmt.Errorf("vm up: %v", err)
	}
	fmt.Fprintf(os.Stderr, "%s: VM up in %.1fs (%s, %s)\n", name, time.Since(start).Seconds(), in.Accel(), in.KernelRelease())
	client, err := in.Client()
	if err != nil {
		in.Down(context.Background())
		os.RemoveAll(tmp)
		return nil, nil, err
	}
	down := func() {
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := in.Down(dctx); err != nil {
			fmt.Fprintf(os.Stderr, "%s: vm down: %v\n", name, err)
		}
		os.RemoveAll(tmp)
	}
	return &VM{Instance: in, Client: client, Bin: bin, Cache: cache, Scratch: tmp}, down, nil
}

// diedBeforeInit: the boot's serial log shows the kernel never reached
// the guest's /init.
func diedBeforeInit(stateDir string) bool {
	log := readFile(filepath.Join(stateDir, "serial.log"))
	return log != "" && !strings.Contains(log, "kinst-init:")
}

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}

// Exec runs argv in the guest and returns stdout, stderr and the status.
func (g *VM) Exec(t testing.TB, ctx context.Context, argv ...string) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	code, err := g.Instance.Exec(ctx, argv, &out, &errb)
	if err != nil {
		t.Fatalf("guest exec %q: %v", argv, err)
	}
	return out.String(), errb.String(), code
}

// Sh runs a shell script in the guest and fails the test unless it exits 0.
func (g *VM) Sh(t testing.TB, ctx context.Context, script string) string {
	t.Helper()
	out, errs, code := g.Exec(t, ctx, "sh", "-c", script)
	if code != 0 {
		t.Fatalf("guest sh -c %q: status %d\nstdout: %s\nstderr: %s", script, code, out, errs)
	}
	return out
}

// QEMUBytes reads n bytes of guest kernel memory at addr as QEMU sees
// them: an oracle independent of kinst's driver.
func (g *VM) QEMUBytes(t testing.TB, addr uint64, n int) []byte {
	t.Helper()
	b, err := g.ReadVirt(addr, n)
	if err != nil {
		t.Fatalf("QEMU read %#x: %v", addr, err)
	}
	return b
}

// Within fails t unless lo <= got <= hi.
func Within(t testing.TB, what string, got, lo, hi float64) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %.4g, want [%.4g, %.4g]", what, got, lo, hi)
	}
}

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Tail is the last n lines of s (a serial log, a command's output).
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// reapStaleVMs stops test VMs whose test process is gone.
func reapStaleVMs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "kinst-live-*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "owner.pid"))
		if err != nil {
			continue
		}
		if owner, _ := strconv.Atoi(strings.TrimSpace(string(b))); owner > 0 && processAlive(owner) {
			continue // still running
		}
		if in, err := vm.Attach(filepath.Join(d, "vm")); err == nil {
			fmt.Fprintf(os.Stderr, "live: stopping a VM left by a crashed run (%s)\n", d)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			in.Down(ctx)
			cancel()
		}
		os.RemoveAll(d)
	}
}

// processAlive: the process exists and is not a zombie waiting to be
// reaped.
func processAlive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(st), ") ")
	return !strings.HasPrefix(rest, "Z")
}

// DebugVmlinux is Debian's debug vmlinux of the guest's kernel (from
// linux-image-RELEASE-dbg, about 860 MB), downloaded once into the cache.
func (g *VM) DebugVmlinux(t testing.TB) string {
	t.Helper()
	vmlinux, _ := g.debugFiles(t)
	return vmlinux
}

// DebugModules is the directory of Debian's debug files of the guest
// kernel's modules that the guest loads (DebugModuleNames), from the same
// package, fetched with the vmlinux.
func (g *VM) DebugModules(t testing.TB) string {
	t.Helper()
	_, mods := g.debugFiles(t)
	return mods
}

// DebugModuleNames are the modules whose debug files DebugModules keeps:
// modules the guest loads at boot.
var DebugModuleNames = []string{"evdev"}

// debugFiles fetches (once) linux-image-RELEASE-dbg and keeps of it the
// debug vmlinux and DebugModuleNames' debug files.
func (g *VM) debugFiles(t testing.TB) (vmlinux, mods string) {
	t.Helper()
	rel := g.KernelRelease()
	dir := filepath.Join(g.Cache, "kernel", "linux-image-"+rel+"-dbg")
	vmlinux, mods = filepath.Join(dir, "vmlinux-"+rel), filepath.Join(dir, "modules")
	have := func(p string) bool { _, err := os.Stat(p); return err == nil }
	done := have(vmlinux)
	for _, m := range DebugModuleNames {
		done = done && have(filepath.Join(mods, m+".ko"))
	}
	if done {
		return vmlinux, mods
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	dl := exec.Command("apt-get", "download", "linux-image-"+rel+"-dbg")
	dl.Dir = dir
	if b, err := dl.CombinedOutput(); err != nil {
		t.Skipf("apt-get download linux-image-%s-dbg: %v\n%s", rel, err, b)
	}
	debs, _ := filepath.Glob(filepath.Join(dir, "*.deb"))
	if len(debs) != 1 {
		t.Skipf("no single .deb in %s: %v", dir, debs)
	}
	tmp, err := os.MkdirTemp(dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	patterns := []string{"*/boot/vmlinux-" + rel}
	for _, m := range DebugModuleNames {
		patterns = append(patterns, "*/"+m+".ko")
	}
	x := exec.Command("sh", append([]string{"-c", `deb="$1" to="$2"; shift 2; dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$to" --wildcards "$@"`,
		"sh", debs[0], tmp}, patterns...)...)
	if b, err := x.CombinedOutput(); err != nil {
		t.Fatalf("extracting the debug files: %v\n%s", err, b)
	}
	os.MkdirAll(mods, 0o755)
	err = filepath.WalkDir(tmp, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		to := filepath.Join(mods, d.Name())
		if d.Name() == "vmlinux-"+rel {
			to = vmlinux
		}
		return os.Rename(p, to)
	})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(debs[0])
	t.Logf("debug files of %s fetched in %.0fs", rel, time.Since(start).Seconds())
	return vmlinux, mods
}

// ArtifactDir is where a live test keeps what a person may want to look
// at after the run (screenshots): $KINST_ARTIFACTS/name, else
// .cache/artifacts/name under the repository (git-ignored).
func ArtifactDir(name string) string {
	if d := os.Getenv("KINST_ARTIFACTS"); d != "" {
		return filepath.Join(d, name)
	}
	return filepath.Join(RepoRoot(), ".cache", "artifacts", name)
}

// FillHeap fills the guest's heap as a busy machine's: 100,000 files in
// a fresh tmpfs (dentries, inodes, LSM blobs, a tmpfs directory's offset
// tree) and 200 sleeping processes, so that a type graph's share typed
// measures a heap of known objects rather than boot-time leftovers.
// EmptyHeap undoes it.
func (g *VM) FillHeap(t testing.TB, ctx context.Context) {
	t.Helper()
	n := strings.TrimSpace(g.Sh(t, ctx, `mkdir -p /tmp/kinst-tgb && mount -t tmpfs none /tmp/kinst-tgb && cd /tmp/kinst-tgb &&
seq 1 100000 | sed s/^/f/ | xargs touch && ls | wc -l`))
	if n != "100000" {
		t.Fatalf("the guest made %s files, not 100000", n)
	}
	t.Logf("sleeping processes: %s", g.Sh(t, ctx, `cd / && for i in $(seq 200); do setsid sh -c 'exec sleep 3001' </dev/null >/dev/null 2>&1 & done;
sleep 1; ps | grep -c '[s]leep 3001'`))
}

// EmptyHeap undoes FillHeap.
func (g *VM) EmptyHeap(t testing.TB, ctx context.Context) {
	g.Sh(t, ctx, `umount /tmp/kinst-tgb; for p in $(ps | grep '[s]leep 3001' | awk '{print $1}'); do kill $p; done; true`)
}

// countersClean checks kerninstd after a package's tests: nothing left
// installed, no free counter slot written and none handed out dirty
// (api.Info). A patch that
// outlives its request writes a slot that is free, then someone else's;
// a timer word written so reads as hours of wall time.
func countersClean(c *api.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in, err := c.Info(ctx)
	if err != nil {
		return nil // no daemon to ask (a test stopped it): nothing to check
	}
	if in.Splices != 0 || in.DriverSplices != 0 || in.Sessions != 0 {
		return fmt.Errorf("%d splices (the driver counts %d) and %d sessions left installed", in.Splices, in.DriverSplices, in.Sessions)
	}
	if in.DirtyFreeCounters != 0 || in.StaleCounterWrites != 0 {
		return fmt.Errorf("%d free counter slots written, %d handed out written: a patch outlived its request", in.DirtyFreeCounters, in.StaleCounterWrites)
	}
	return nil
}

// watchCounters asks kerninstd every 10 s whether a free counter slot
// was written (countersClean) and says so, with the time, when the count
// grows: in a package's run of an hour, the time names the test.
func watchCounters(name string, c *api.Client) (stop func()) {
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(10 * time.Second)
		defer tick.Stop()
		last := 0
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			in, err := c.Info(ctx)
			cancel()
			if n := in.DirtyFreeCounters + in.StaleCounterWrites; err == nil && n > last {
				fmt.Fprintf(os.Stderr, "%s: %s: %d free counter slots written, %d handed out written\n",
					name, time.Now().Format(time.TimeOnly), in.DirtyFreeCounters, in.StaleCounterWrites)
				last = n
			}
		}
	}()
	return func() { close(done) }
}
