// Package hostdriver puts kinst's kernel half on a real host: it builds
// kerninst.ko against the running kernel's headers (cached by the
// kernel's build id), loads and unloads it, starts and stops kerninstd,
// and says plainly what stops it (missing headers, Secure Boot or
// lockdown, a kernel without the options kinst needs). The test VM has
// its own path (package vm); both build the module with driver/linux.
package hostdriver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/debuginfo"
	"github.com/kinst/kinst/driver/linux"
	"github.com/kinst/kinst/output"
	"golang.org/x/sys/unix"
)

// ModuleName is the driver's name in /proc/modules.
const ModuleName = "kerninst"

// Errors Load and Unload wrap, for errors.Is.
var (
	ErrNoHeaders      = linux.ErrNoHeaders
	ErrModuleRefused  = errors.New("the kernel refused kerninst.ko")
	ErrKernelLacks    = errors.New("the kernel lacks what kinst needs")
	ErrForeignDaemon  = errors.New("a kerninstd this command did not start holds /dev/kerninst")
	ErrNotRoot        = errors.New("needs root")
	ErrModuleNotFound = errors.New("module file not found")
)

// Host describes where things are on the machine. The zero value of each
// field means the usual place; tests point Root at a fake tree.
type Host struct {
	Root      string // prefix of /proc, /sys, /boot, /lib/modules, /dev ("" is /)
	Release   string // kernel release (default: uname -r)
	CacheDir  string // built modules go under CacheDir/module
	Kerninstd string // kerninstd binary (default: next to kinst)
	Socket    string // kerninstd's socket (default api.DefaultSocket)
	PIDFile   string // default /run/kerninstd.pid
	LogFile   string // default /var/log/kerninstd.log
	// Args are extra kerninstd arguments (--listen, --token-file, …).
	Args []string
	Say  func(format string, a ...any) // progress, may be nil
}

func (h *Host) path(p string) string { return filepath.Join(h.Root, p) }

func (h *Host) say(f string, a ...any) {
	if h.Say != nil {
		h.Say(f, a...)
	}
}

func (h *Host) release() string {
	if h.Release != "" {
		return h.Release
	}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Release = unix.ByteSliceToString(u.Release[:])
	}
	return h.Release
}

func (h *Host) socket() string {
	if h.Socket != "" {
		return h.Socket
	}
	return api.DefaultSocket
}

func (h *Host) pidFile() string {
	if h.PIDFile != "" {
		return h.PIDFile
	}
	return h.path("/run/kerninstd.pid")
}

func (h *Host) logFile() string {
	if h.LogFile != "" {
		return h.LogFile
	}
	return h.path("/var/log/kerninstd.log")
}

// Status reads what the host has of kinst and what it lacks.
func (h *Host) Status(ctx context.Context) output.DriverStatus {
	st := output.DriverStatus{KernelRelease: h.release(), Socket: h.socket(), Missing: []output.KernelOption{},
		Recommended: []output.KernelOption{}, Problems: []string{}}
	st.BuildID, _ = debuginfo.KernelBuildID(h.path("/sys/kernel/notes"))
	st.ModuleLoaded = h.moduleLoaded()
	_, err := os.Stat(h.path("/dev/kerninst"))
	st.Device = err == nil
	st.KerninstdPID = h.daemonPID()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = api.NewClient(h.socket()).Info(cctx)
	cancel()
	st.Kerninstd = err == nil
	st.Lockdown = h.lockdown()
	st.SecureBoot = h.secureBoot()
	c, where, err := ReadConfig(h.Root, st.KernelRelease)
	if err != nil {
		st.Problems = append(st.Problems, err.Error())
	} else {
		st.Config = where
		st.Missing, st.Recommended = Missing(c)
		for _, o := range st.Missing {
			st.Problems = append(st.Problems, fmt.Sprintf("kernel built without %s: %s", o.Name, o.Why))
		}
		if c.ModuleSigForced() && !st.ModuleLoaded {
			st.Problems = append(st.Problems, "CONFIG_MODULE_SIG_FORCE: only signed modules load; sign kerninst.ko with a key the kernel trusts")
		}
	}
	if st.Lockdown != "" && st.Lockdown != "none" && !st.ModuleLoaded {
		st.Problems = append(st.Problems, lockdownProblem(st.Lockdown, st.SecureBoot))
	}
	if !st.ModuleLoaded {
		if _, err := os.Stat(h.headers()); err != nil {
			st.Problems = append(st.Problems, headersProblem(h.headers(), st.KernelRelease))
		}
	}
	return st
}

func lockdownProblem(mode string, sb *bool) string {
	why := "kernel lockdown (" + mode + ")"
	if sb != nil && *sb {
		why += ", from Secure Boot,"
	}
	return why + " loads only modules signed by a key the kernel trusts: sign kerninst.ko (scripts/sign-file with a key enrolled by mokutil), or turn Secure Boot off"
}

func headersProblem(dir, release string) string {
	return fmt.Sprintf("no kernel headers in %s: %s", dir, headersHint(release))
}

func headersHint(release string) string {
	return fmt.Sprintf("install them (Debian/Ubuntu: apt-get install linux-headers-%s; Fedora/RHEL: dnf install kernel-devel-%s), or give a built module with --ko", release, release)
}

func (h *Host) headers() string { return h.path("/lib/modules/" + h.release() + "/build") }

func (h *Host) moduleLoaded() bool {
	b, err := os.ReadFile(h.path("/proc/modules"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if name, _, _ := strings.Cut(l, " "); name == ModuleName {
			return true
		}
	}
	return false
}

// lockdown returns the bracketed mode of /sys/kernel/security/lockdown
// ("none [integrity] confidentiality"), "" without the lockdown LSM.
func (h *Host) lockdown() string {
	b, err := os.ReadFile(h.path("/sys/kernel/security/lockdown"))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.IndexByte(s, '['); i >= 0 {
		if j := strings.IndexByte(s[i:], ']'); j > 0 {
			return s[i+1 : i+j]
		}
	}
	return ""
}

// secureBoot reads the EFI SecureBoot variable: four bytes of attributes,
// then the value.
func (h *Host) secureBoot() *bool {
	b, err := os.ReadFile(h.path("/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-e0a9e5b3b76c"))
	if err != nil || len(b) < 5 {
		return nil
	}
	on := b[4] == 1
	return &on
}

// daemonPID is the pid in the pid file if that process is a running
// kerninstd, else 0.
func (h *Host) daemonPID() int {
	b, err := os.ReadFile(h.pidFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return 0
	}
	comm, err := os.ReadFile(h.path(fmt.Sprintf("/proc/%d/comm", pid)))
	if err != nil || strings.TrimSpace(string(comm)) != "kerninstd" {
		return 0
	}
	return pid
}

// LoadOptions are `kinst driver load`'s choices.
type LoadOptions struct {
	Module   string // a built kerninst.ko to load instead of building one
	Headers  string // the kernel build tree (default /lib/modules/RELEASE/build)
	NoDaemon bool   // load the module only (kerninstd run by systemd)
}

// Load builds (or takes) kerninst.ko, loads it unless it is loaded, and
// starts kerninstd unless one answers or o.NoDaemon.
func (h *Host) Load(ctx context.Context, o LoadOptions) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("kinst driver load: %w (it loads a kernel module)", ErrNotRoot)
	}
	if !h.moduleLoaded() {
		if err := h.preflight(); err != nil {
			return err
		}
		ko := o.Module
		if ko == "" {
			var err error
			if ko, err = h.build(ctx, o.Headers); err != nil {
				return err
			}
		} else if _, err := os.Stat(ko); err != nil {
			return fmt.Errorf("%w: %s", ErrModuleNotFound, ko)
		}
		if err := h.insmod(ko); err != nil {
			return err
		}
		h.say("loaded %s", ko)
	} else {
		h.say("kerninst is already loaded")
	}
	if err := h.waitDevice(ctx); err != nil {
		return err
	}
	if o.NoDaemon {
		return nil
	}
	return h.startDaemon(ctx)
}

// preflight refuses, before any build, a kernel kinst cannot work on.
func (h *Host) preflight() error {
	c, where, err := ReadConfig(h.Root, h.release())
	if err != nil {
		h.say("warning: %v; not checking kernel options", err)
		return nil
	}
	if req, _ := Missing(c); len(req) > 0 {
		var b strings.Builder
		for _, o := range req {
			fmt.Fprintf(&b, "\n  %s: %s", o.Name, o.Why)
		}
		return fmt.Errorf("%w (per %s):%s", ErrKernelLacks, where, b.String())
	}
	return nil
}

func (h *Host) build(ctx context.Context, headers string) (string, error) {
	if headers == "" {
		headers = h.headers()
	}
	key, _ := debuginfo.KernelBuildID(h.path("/sys/kernel/notes"))
	if key == "" {
		key = h.release()
	}
	if _, err := os.Stat(filepath.Join(headers, "Makefile")); err != nil {
		// A cached module for this build id needs no headers.
		if ko, err := linux.Build(ctx, "", h.CacheDir, key, nil); err == nil {
			return ko, nil
		}
		return "", fmt.Errorf("%w in %s: %s", ErrNoHeaders, headers, headersHint(h.release()))
	}
	start := time.Now()
	ko, err := linux.Build(ctx, headers, h.CacheDir, key, h.Say)
	if err == nil && time.Since(start) > time.Second {
		h.say("built %s in %.1fs", ko, time.Since(start).Seconds())
	}
	return ko, err
}

// insmod loads ko with finit_module and turns the kernel's refusals into
// reasons.
func (h *Host) insmod(ko string) error {
	f, err := os.Open(ko)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrModuleNotFound, err)
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err == nil || errors.Is(err, unix.EEXIST) {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrModuleRefused, h.refusal(err))
}

// refusal explains finit_module's errno.
func (h *Host) refusal(err error) string {
	switch {
	case errors.Is(err, unix.EKEYREJECTED), errors.Is(err, unix.ENOKEY), errors.Is(err, unix.EBADMSG):
		return fmt.Sprintf("%v: the module's signature is missing or not trusted (Secure Boot or CONFIG_MODULE_SIG_FORCE); sign kerninst.ko with a key the kernel trusts", err)
	case errors.Is(err, unix.EPERM):
		if b, _ := os.ReadFile(h.path("/proc/sys/kernel/modules_disabled")); strings.TrimSpace(string(b)) == "1" {
			return "module loading is disabled until reboot (kernel.modules_disabled=1)"
		}
		if m := h.lockdown(); m != "" && m != "none" {
			return lockdownProblem(m, h.secureBoot())
		}
		return fmt.Sprintf("%v: not permitted (missing CAP_SYS_MODULE, or a security module forbids loading)", err)
	case errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.EINVAL):
		return fmt.Sprintf("%v: the module was built for another kernel than %s (see dmesg: version magic or symbol versions)", err, h.release())
	case errors.Is(err, unix.ENOENT):
		return fmt.Sprintf("%v: a symbol the module needs is not exported by this kernel (see dmesg)", err)
	}
	return err.Error()
}

func (h *Host) waitDevice(ctx context.Context) error {
	dev := h.path("/dev/kerninst")
	for i := 0; ; i++ {
		if _, err := os.Stat(dev); err == nil {
			return nil
		}
		if i == 50 {
			return fmt.Errorf("kerninst is loaded but %s did not appear (is devtmpfs mounted?)", dev)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (h *Host) kerninstd() (string, error) {
	if h.Kerninstd != "" {
		return h.Kerninstd, nil
	}
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(self), "kerninstd")
	if _, err := os.Stat(p); err != nil {
		if lp, lerr := exec.LookPath("kerninstd"); lerr == nil {
			return lp, nil
		}
		return "", fmt.Errorf("no kerninstd next to kinst (%s) or on PATH: give --kerninstd", p)
	}
	return p, nil
}

// startDaemon starts kerninstd in its own session, logging to LogFile,
// and waits until it answers.
func (h *Host) startDaemon(ctx context.Context) error {
	c := api.NewClient(h.socket())
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.Info(cctx)
	cancel()
	if err == nil {
		h.say("kerninstd already answers on %s", h.socket())
		return nil
	}
	bin, err := h.kerninstd()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(h.logFile()), 0o755); err != nil {
		return err
	}
	log, err := os.OpenFile(h.logFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(bin, append([]string{"--socket", h.socket()}, h.Args...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %v", bin, err)
	}
	pid := cmd.Process.Pid
	if err := os.WriteFile(h.pidFile(), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
		cmd.Process.Kill()
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	h.say("started kerninstd (pid %d), log %s", pid, h.logFile())
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ready := make(chan error, 1)
	go func() { ready <- c.WaitReady(rctx, 2*time.Minute) }()
	select {
	case err := <-ready:
		return err
	case err := <-exited:
		os.Remove(h.pidFile())
		return fmt.Errorf("kerninstd exited at start (%v); its log %s ends:\n%s", err, h.logFile(), tail(h.logFile(), 10))
	}
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// UnloadOptions are `kinst driver unload`'s choices.
type UnloadOptions struct {
	// ModuleOnly: leave kerninstd alone (systemd stops it first).
	ModuleOnly bool
}

// Unload stops the kerninstd Load started (the driver restores every
// splice when its device closes) and removes the module.
func (h *Host) Unload(ctx context.Context, o UnloadOptions) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("kinst driver unload: %w", ErrNotRoot)
	}
	if !o.ModuleOnly {
		if pid := h.daemonPID(); pid > 0 {
			if err := stopPID(ctx, pid); err != nil {
				return err
			}
			h.say("stopped kerninstd (pid %d)", pid)
		}
		os.Remove(h.pidFile())
	}
	if !h.moduleLoaded() {
		h.say("kerninst is not loaded")
		return nil
	}
	var err error
	for i := 0; i < 50; i++ { // the device's last close may still be running
		if err = unix.DeleteModule(ModuleName, unix.O_NONBLOCK); err == nil || errors.Is(err, unix.ENOENT) {
			h.say("unloaded kerninst")
			return nil
		}
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("%w: stop it first (systemctl stop kerninstd, or the process holding it: fuser /dev/kerninst)", ErrForeignDaemon)
	}
	return fmt.Errorf("delete_module kerninst: %v", err)
}

// stopPID sends SIGTERM, then SIGKILL after 30 s, and waits for the exit.
func stopPID(ctx context.Context, pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	p.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(30 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			p.Signal(syscall.SIGKILL)
			deadline = time.Now().Add(time.Hour)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// alive: the process exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}
