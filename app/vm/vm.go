// Package vm runs the test VM: a stock Debian kernel under QEMU with
// kerninst.ko loaded and kerninstd running, reachable from the host only
// through loopback port forwards. It fetches and caches everything it
// needs (kernel package, module build, initramfs), boots, waits until the
// guest answers, and lets other processes find the running instance
// through a state file.
package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kinst/kinst/api"
)

// Guest ports; the host reaches them through hostfwd on 127.0.0.1.
const (
	GuestKerninstdPort = 7070
	GuestAgentPort     = 7071
)

var (
	// ErrNotRunning: no instance is running for the state directory.
	ErrNotRunning = errors.New("no test VM is running (start one with `kinst vm up`)")
	// ErrAlreadyRunning: an instance already runs for the state directory.
	ErrAlreadyRunning = errors.New("a test VM is already running (stop it with `kinst vm down`)")
)

// DefaultCPU is the guest CPU under TCG: QEMU's qemu64 without cx16.
// QEMU before 8.0 (Debian 12 ships 7.2) computes cmpxchg16b's flags from
// stale state, and a splice's popfq or iretq before SLUB's cmpxchg16b
// then puts a kernel pointer into RFLAGS and the guest oopses
// (internal/cpuquirk; kerninstd does not splice on such a CPU). Without
// cx16 the kernel takes SLUB's locked path instead.
const DefaultCPU = "qemu64,-cx16"

// Config says what to boot and where to cache.
type Config struct {
	CacheDir      string // downloads and builds, reused across runs
	StateDir      string // the running instance's files; default CacheDir/vm
	SMP           int    // default 2
	MemoryMB      int    // default 1024
	Accel         string // "auto" (default), "tcg", "tcg-single" or "kvm"
	KinstBin      string // static binaries put in the guest's /bin
	KerninstdBin  string
	KernelPackage string // default: what linux-image-amd64 depends on
	// NoDriver boots without loading kerninst.ko: kerninstd then serves
	// count and time with BPF, as on a host that refuses modules.
	NoDriver bool
	// CPU is QEMU's -cpu under TCG; default DefaultCPU. KVM always runs
	// the host's CPU.
	CPU string
	// Append is more of the guest kernel's command line (slub_debug=…).
	Append   string
	Progress io.Writer // human progress lines; nil for none
	// Ready, if set, is called once the agent answers; Up returns when it
	// does (e.g. kerninstd in the guest answers its API).
	Ready func(ctx context.Context, in *Instance) error
}

// state is what a running instance leaves in StateDir/state.json.
type state struct {
	PID           int       `json:"pid"`
	AgentPort     int       `json:"agent_port"`
	KerninstdPort int       `json:"kerninstd_port"`
	QMP           string    `json:"qmp"`
	Serial        string    `json:"serial"`
	Release       string    `json:"kernel_release"`
	Accel         string    `json:"accel"`
	Booted        time.Time `json:"booted"`
	BootSeconds   float64   `json:"boot_seconds"`
}

// Instance is a running test VM.
type Instance struct {
	dir string
	st  state
}

func (in *Instance) KerninstdAddr() string { return fmt.Sprintf("127.0.0.1:%d", in.st.KerninstdPort) }
func (in *Instance) AgentAddr() string     { return fmt.Sprintf("127.0.0.1:%d", in.st.AgentPort) }

// TokenFile is the file holding the token kerninstd's TCP listener in the
// guest requires (kinst --token-file, KINST_TOKEN_FILE).
func (in *Instance) TokenFile() string { return filepath.Join(in.dir, "token") }

// Client is a kerninstd client for the guest, with its token.
func (in *Instance) Client() (*api.Client, error) {
	tok, err := api.ReadToken(in.TokenFile())
	if err != nil {
		return nil, err
	}
	return api.NewClient(in.KerninstdAddr()).WithToken(tok), nil
}
func (in *Instance) SerialLog() string     { return in.st.Serial }
func (in *Instance) QMPSocket() string     { return in.st.QMP }
func (in *Instance) KernelRelease() string { return in.st.Release }
func (in *Instance) Accel() string         { return in.st.Accel }
func (in *Instance) BootDuration() time.Duration {
	return time.Duration(in.st.BootSeconds * float64(time.Second))
}

func statePath(dir string) string { return filepath.Join(dir, "state.json") }

// Attach finds the instance running for stateDir.
func Attach(stateDir string) (*Instance, error) {
	b, err := os.ReadFile(statePath(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotRunning
	}
	if err != nil {
		return nil, err
	}
	in := &Instance{dir: stateDir}
	if err := json.Unmarshal(b, &in.st); err != nil {
		return nil, fmt.Errorf("%s: %w", statePath(stateDir), err)
	}
	if !alive(in.st.PID) {
		os.Remove(statePath(stateDir))
		return nil, ErrNotRunning
	}
	return in, nil
}

func alive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

// Running reports whether QEMU still runs (a guest that panicked with
// -no-reboot has made it exit).
func (in *Instance) Running() bool { return alive(in.st.PID) }

// Answers reports whether the guest's agent answers a ping within 3 s:
// a hung guest's does not.
func (in *Instance) Answers(ctx context.Context) bool { return in.ping(ctx) == nil }

// Down asks QEMU to quit, waits for it, and removes the state.
func (in *Instance) Down(ctx context.Context) error {
	if _, err := in.QMP("quit", nil); err != nil && alive(in.st.PID) {
		syscall.Kill(in.st.PID, syscall.SIGTERM)
	}
	deadline := time.Now().Add(15 * time.Second)
	for alive(in.st.PID) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	if alive(in.st.PID) {
		syscall.Kill(in.st.PID, syscall.SIGKILL)
	}
	os.Remove(in.st.QMP)
	return os.Remove(statePath(in.dir))
}

func progress(w io.Writer, start time.Time, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, "vm: [%5.1fs] %s\n", time.Since(start).Seconds(), fmt.Sprintf(format, args...))
	}
}

// Up prepares everything (cached), boots the VM and waits until the guest
// answers.
func Up(ctx context.Context, c Config) (*Instance, error) {
	if c.CacheDir == "" {
		return nil, errors.New("vm: no cache directory")
	}
	if c.StateDir == "" {
		c.StateDir = filepath.Join(c.CacheDir, "vm")
	}
	if c.SMP == 0 {
		c.SMP = 2
	}
	if c.MemoryMB == 0 {
		c.MemoryMB = 1024
	}
	switch c.Accel {
	case "":
		c.Accel = "auto"
	case "auto", "tcg", "tcg-single", "kvm":
	default:
		return nil, fmt.Errorf("vm: unknown accelerator %q (want auto, tcg, tcg-single or kvm)", c.Accel)
	}
	if _, err := Attach(c.StateDir); err == nil {
		return nil, ErrAlreadyRunning
	}
	for _, b := range []string{c.KinstBin, c.KerninstdBin} {
		if err := checkStatic(b); err != nil {
			return nil, err
		}
	}
	start := time.Now()
	if err := os.MkdirAll(c.StateDir, 0o755); err != nil {
		return nil, err
	}
	k, err := fetchKernel(ctx, c.CacheDir, c.KernelPackage, func(f string, a ...any) { progress(c.Progress, start, f, a...) })
	if err != nil {
		return nil, err
	}
	progress(c.Progress, start, "kernel %s ready", k.Release)
	ko, err := buildModule(ctx, c.CacheDir, k.Release, func(f string, a ...any) { progress(c.Progress, start, f, a...) })
	if err != nil {
		return nil, err
	}
	initrd, err := buildInitramfs(c.CacheDir, k, ko, c.KinstBin, c.KerninstdBin)
	if err != nil {
		return nil, err
	}
	progress(c.Progress, start, "initramfs %s", filepath.Base(initrd))
	accel := c.Accel
	if accel == "auto" {
		accel = probeAccel(ctx, c, k, initrd, func(f string, a ...any) { progress(c.Progress, start, f, a...) })
	}
	progress(c.Progress, start, "booting %s with %d vCPUs (%s)", k.Release, c.SMP, accel)
	in, err := boot(ctx, c, k, initrd, accel, 3*time.Minute)
	if err != nil {
		return nil, err
	}
	if c.Ready != nil {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		if err := c.Ready(rctx, in); err != nil {
			in.Down(context.Background())
			return nil, fmt.Errorf("%w\nserial log tail:\n%s", err, serialTail(in.st.Serial, 30))
		}
	}
	in.st.BootSeconds = time.Since(start).Seconds()
	if err := in.save(); err != nil {
		return nil, err
	}
	progress(c.Progress, start, "guest ready: kerninstd at %s, agent at %s", in.KerninstdAddr(), in.AgentAddr())
	return in, nil
}

func (in *Instance) save() error {
	b, err := json.MarshalIndent(in.st, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath(in.dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(in.dir))
}
