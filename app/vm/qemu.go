package vm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const qemuBin = "qemu-system-x86_64"

// freePorts returns n distinct free loopback ports. Every listener is
// held until all are chosen: closed one by one, the kernel may hand the
// same port back twice, and QEMU refuses two forwards on one port.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// portTaken reports QEMU's refusal of a host forward whose port another
// program took between freePorts and QEMU's bind.
func portTaken(out []byte) bool {
	return strings.Contains(string(out), "host forwarding rule")
}

// appendLine is the guest kernel's command line; kinst.nodriver tells
// /init not to load kerninst.ko (the kernel passes the unknown word on to
// /init, which reads it from /proc/cmdline).
//
// trace_event=sched:sched_switch enables that tracepoint's static key
// during boot, before the second CPU is up. Attaching to it later (kinst
// offcpu's BPF program) then only takes a reference, and the kernel never
// patches the jump in __schedule under load: under QEMU 7.2's
// multi-threaded TCG its text_poke_bp left both vCPUs looping on a stale
// translation of its int3 (exc_int3 → kprobe_int3_handler → the same
// int3, at __schedule+0x1bc, while memory held the jump), the hazard the
// driver avoids for its own writes but the kernel cannot for its own.
func appendLine(c Config) string {
	s := "console=ttyS0 panic=-1 kaslr trace_event=sched:sched_switch"
	if c.NoDriver {
		s += " kinst.nodriver"
	}
	if c.Append != "" {
		s += " " + c.Append
	}
	return s
}

// qemuArgs is the command line of the test VM.
func qemuArgs(c Config, k *Kernel, initrd, accel, dir string, agentPort, kdPort int) []string {
	a := []string{
		"-name", "kinst-test",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-m", strconv.Itoa(c.MemoryMB), "-smp", strconv.Itoa(c.SMP),
		"-serial", "file:" + filepath.Join(dir, "serial.log"),
		"-qmp", "unix:" + filepath.Join(dir, "qmp.sock") + ",server=on,wait=off",
		"-device", "vmcoreinfo",
		// kerninstd's TCP token, read by the guest's /init.
		"-fw_cfg", "name=opt/kinst/token,file=" + filepath.Join(dir, "token"),
		// User-mode networking, restricted: the guest reaches nothing; the
		// host reaches the guest only through these loopback forwards.
		"-netdev", fmt.Sprintf("user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:%d-:%d,hostfwd=tcp:127.0.0.1:%d-:%d",
			kdPort, GuestKerninstdPort, agentPort, GuestAgentPort),
		"-device", "virtio-net-pci,netdev=n0",
		"-kernel", k.Vmlinuz, "-initrd", initrd,
		"-append", appendLine(c),
		"-pidfile", filepath.Join(dir, "qemu.pid"), "-daemonize",
	}
	if accel == "kvm" {
		return append(a, "-accel", "kvm", "-cpu", "host")
	}
	cpu := c.CPU
	if cpu == "" {
		cpu = DefaultCPU // see DefaultCPU: no cmpxchg16b under TCG
	}
	a = append(a, "-cpu", cpu)
	if accel == "tcg-single" {
		// One host thread runs every vCPU in turn: slower, but a vCPU
		// never keeps a stale translation of code another vCPU rewrote,
		// which under multi-threaded TCG can livelock the kernel's own
		// text_poke_bp (tracefs kprobes, static calls).
		return append(a, "-accel", "tcg,thread=single")
	}
	return append(a, "-accel", "tcg,thread=multi")
}

// boot starts QEMU and waits until the guest's agent answers.
func boot(ctx context.Context, c Config, k *Kernel, initrd, accel string, timeout time.Duration) (*Instance, error) {
	if _, err := exec.LookPath(qemuBin); err != nil {
		return nil, fmt.Errorf("%s not found (apt-get install qemu-system-x86)", qemuBin)
	}
	dir := c.StateDir
	if err := newToken(filepath.Join(dir, "token")); err != nil {
		return nil, err
	}
	var agentPort, kdPort int
	for try := 1; ; try++ {
		ports, err := freePorts(2)
		if err != nil {
			return nil, err
		}
		agentPort, kdPort = ports[0], ports[1]
		os.Remove(filepath.Join(dir, "serial.log"))
		os.Remove(filepath.Join(dir, "qemu.pid"))
		cmd := exec.CommandContext(ctx, qemuBin, qemuArgs(c, k, initrd, accel, dir, agentPort, kdPort)...)
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if !portTaken(out) || try == 3 {
			return nil, fmt.Errorf("%s: %v\n%s", qemuBin, err, out)
		}
	}
	pb, err := os.ReadFile(filepath.Join(dir, "qemu.pid"))
	if err != nil {
		return nil, fmt.Errorf("qemu left no pidfile: %w", err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(pb)))
	in := &Instance{dir: dir, st: state{PID: pid, AgentPort: agentPort, KerninstdPort: kdPort,
		QMP: filepath.Join(dir, "qmp.sock"), Serial: filepath.Join(dir, "serial.log"),
		Release: k.Release, Accel: accel, Booted: time.Now()}}
	if err := in.save(); err != nil {
		in.kill()
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		if err := in.ping(ctx); err == nil {
			return in, nil
		} else if !alive(pid) {
			os.Remove(statePath(dir))
			return nil, fmt.Errorf("qemu exited during boot\nserial log tail:\n%s", serialTail(in.st.Serial, 30))
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			in.kill()
			return nil, fmt.Errorf("guest did not answer within %v (%v)\nserial log tail:\n%s", timeout, err, serialTail(in.st.Serial, 30))
		}
		time.Sleep(300 * time.Millisecond)
	}
}

func (in *Instance) kill() {
	syscall.Kill(in.st.PID, syscall.SIGKILL)
	os.Remove(statePath(in.dir))
}

func serialTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no serial log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// probeAccel decides between KVM and TCG. On the machines this project was
// measured on, /dev/kvm exists but a KVM guest hangs after decompression,
// so KVM is used only if a short trial boot reaches /init. The verdict is
// cached per host kernel and QEMU version.
func probeAccel(ctx context.Context, c Config, k *Kernel, initrd string, say func(string, ...any)) string {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return "tcg"
	}
	f.Close()
	var u syscall.Utsname
	syscall.Uname(&u)
	qv, _ := exec.Command(qemuBin, "--version").Output()
	h := sha256.Sum256([]byte(fmt.Sprintf("%v|%s|%s", u.Release, qv, k.Release)))
	verdict := filepath.Join(c.CacheDir, "accel-"+hex.EncodeToString(h[:8]))
	if b, err := os.ReadFile(verdict); err == nil {
		return strings.TrimSpace(string(b))
	}
	say("probing KVM (a trial boot of up to 20 s)")
	pc := c
	pc.StateDir = filepath.Join(c.CacheDir, "kvm-probe")
	os.MkdirAll(pc.StateDir, 0o755)
	result := "tcg"
	if in, err := boot(ctx, pc, k, initrd, "kvm", 20*time.Second); err == nil {
		result = "kvm"
		in.Down(ctx)
	}
	say("KVM probe: using %s", result)
	os.WriteFile(verdict, []byte(result+"\n"), 0o644)
	return result
}

// newToken writes a fresh random token for the guest kerninstd's TCP
// listener, readable by the owner only.
func newToken(path string) error {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	os.Remove(path)
	return os.WriteFile(path, []byte(hex.EncodeToString(b)+"\n"), 0o600)
}
