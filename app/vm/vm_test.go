package vm

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestTopoOrder(t *testing.T) {
	deps := map[string][]string{
		"virtio_net":            {"net_failover", "virtio_ring", "virtio"},
		"net_failover":          {"failover"},
		"failover":              nil,
		"virtio_ring":           nil,
		"virtio":                nil,
		"virtio_pci":            {"virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio", "virtio_ring"},
		"virtio_pci_modern_dev": nil, "virtio_pci_legacy_dev": nil,
	}
	lookup := func(n string) (module, error) {
		d, ok := deps[n]
		if !ok {
			return module{}, errors.New("missing " + n)
		}
		return module{name: n, depends: d}, nil
	}
	mods, err := topoOrder([]string{"virtio_pci", "virtio_net"}, lookup)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		pos[m.name] = i
	}
	if len(mods) != len(deps) {
		t.Fatalf("order %v has %d modules, want %d", mods, len(mods), len(deps))
	}
	for n, ds := range deps {
		for _, d := range ds {
			if pos[d] > pos[n] {
				t.Errorf("%s loads before its dependency %s", n, d)
			}
		}
	}
	deps["failover"] = []string{"virtio_net"}
	if _, err := topoOrder([]string{"virtio_net"}, lookup); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Errorf("cycle not detected: %v", err)
	}
	if _, err := topoOrder([]string{"nope"}, lookup); err == nil {
		t.Error("missing module not reported")
	}
}

func TestReadModinfo(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "m.c")
	os.WriteFile(src, []byte(`__attribute__((section(".modinfo"), used)) static const char a[] = "license=GPL";
__attribute__((section(".modinfo"), used)) static const char b[] = "depends=virtio,virtio_ring";
__attribute__((section(".modinfo"), used)) static const char c[] = "name=virtio_net";
`), 0o600)
	obj := filepath.Join(dir, "m.o")
	if out, err := exec.Command("gcc", "-c", "-o", obj, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	f, _ := os.Open(obj)
	defer f.Close()
	d, err := readModinfo(f)
	if err != nil || !reflect.DeepEqual(d, []string{"virtio", "virtio_ring"}) {
		t.Errorf("depends = %q, %v", d, err)
	}
}

func TestParseHMPBytes(t *testing.T) {
	out := "ffffffff81000000: 0x48 0x8d 0x25 0x51 0x3f 0x60 0x01 0x48\r\nffffffff81000008: 0x8d 0x3d\r\n"
	b, err := parseHMPBytes(out, 0xffffffff81000000)
	if err != nil || !bytes.Equal(b, []byte{0x48, 0x8d, 0x25, 0x51, 0x3f, 0x60, 0x01, 0x48, 0x8d, 0x3d}) {
		t.Errorf("parse = % x, %v", b, err)
	}
	if _, err := parseHMPBytes("Cannot access memory\r\n", 0x1000); err == nil {
		t.Error("monitor error not reported")
	}
	if _, err := parseHMPBytes("0000000000002000: 0x00\r\n", 0x1000); err == nil {
		t.Error("wrong address not reported")
	}
}

func startAgent(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go ServeAgent(ctx, ln)
	return ln.Addr().String()
}

func TestAgentExec(t *testing.T) {
	addr := startAgent(t)
	ctx := context.Background()
	if _, err := agentExec(ctx, addr, agentRequest{Ping: true}, nil, nil); err != nil {
		t.Fatalf("ping: %v", err)
	}
	var out, errb bytes.Buffer
	code, err := agentExec(ctx, addr, agentRequest{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, &out, &errb)
	if err != nil || code != 3 || out.String() != "out\n" || errb.String() != "err\n" {
		t.Errorf("exec: code %d err %v stdout %q stderr %q", code, err, out.String(), errb.String())
	}
	code, _ = agentExec(ctx, addr, agentRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}}, &out, &errb)
	if code != 128+15 {
		t.Errorf("killed by SIGTERM: status %d, want 143", code)
	}
	if _, err := agentExec(ctx, addr, agentRequest{Argv: []string{"/no/such/binary"}}, &out, &errb); err == nil {
		t.Error("missing binary: no error")
	}
}

func TestAgentCancelInterrupts(t *testing.T) {
	addr := startAgent(t)
	mark := filepath.Join(t.TempDir(), "interrupted")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := agentExec(ctx, addr, agentRequest{Argv: []string{"sh", "-c",
		"trap 'echo int > " + mark + "; exit 1' INT; sleep 30 & wait"}}, new(bytes.Buffer), new(bytes.Buffer))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("cancel: err %v after %v", err, time.Since(start))
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, _ := os.ReadFile(mark); strings.TrimSpace(string(b)) == "int" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the command never got SIGINT")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestQemuAccelArgs(t *testing.T) {
	for _, c := range []struct{ accel, cpu, want, wantCPU string }{
		{"kvm", "", "kvm", "host"},
		{"tcg", "", "tcg,thread=multi", DefaultCPU},
		{"tcg-single", "", "tcg,thread=single", DefaultCPU},
		{"tcg", "qemu64", "tcg,thread=multi", "qemu64"},
	} {
		a := qemuArgs(Config{SMP: 2, MemoryMB: 512, CPU: c.cpu}, &Kernel{}, "initrd", c.accel, "/state", 1, 2)
		got, cpu := "", ""
		for i := range a[:len(a)-1] {
			switch a[i] {
			case "-accel":
				got = a[i+1]
			case "-cpu":
				cpu = a[i+1]
			}
		}
		if got != c.want || cpu != c.wantCPU {
			t.Errorf("accel %s, cpu %q: -accel %q -cpu %q, want %q %q", c.accel, c.cpu, got, cpu, c.want, c.wantCPU)
		}
	}
	if _, err := Up(context.Background(), Config{Accel: "hvf", CacheDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "unknown accelerator") {
		t.Errorf("Up with an unknown accelerator: %v", err)
	}
}

func TestKernelPackage(t *testing.T) {
	for _, c := range []struct{ in, pkg, rel, err string }{
		{in: "linux-image-6.1.0-56-amd64", pkg: "linux-image-6.1.0-56-amd64", rel: "6.1.0-56-amd64"},
		{in: "6.12.117+deb12-rt-amd64", pkg: "linux-image-6.12.117+deb12-rt-amd64", rel: "6.12.117+deb12-rt-amd64"},
		{in: "6.12.117+deb12-cloud-amd64", pkg: "linux-image-6.12.117+deb12-cloud-amd64", rel: "6.12.117+deb12-cloud-amd64"},
		{in: "linux-image-amd64", err: "metapackage"},
		{in: "linux-image-6.1.0-56-amd64-dbg", err: "without -dbg"},
		{in: "6.12.117+deb12-amd64-unsigned", err: "without -dbg or -unsigned"},
		{in: "../etc", err: "want a Debian kernel package"},
		{in: "", err: "want a Debian kernel package"},
	} {
		pkg, rel, err := kernelPackage(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("kernelPackage(%q) = %q, %v; want error with %q", c.in, pkg, err, c.err)
			}
			continue
		}
		if err != nil || pkg != c.pkg || rel != c.rel {
			t.Errorf("kernelPackage(%q) = %q, %q, %v; want %q, %q", c.in, pkg, rel, err, c.pkg, c.rel)
		}
	}
}

// A root the kernel builds in is left out; compressed modules are found
// by their module name and their .modinfo read through the decompressor.
func TestModuleOrderBuiltinAndCompressed(t *testing.T) {
	if _, err := exec.LookPath("xz"); err != nil {
		t.Skip("xz not installed")
	}
	dir := t.TempDir()
	kdir := filepath.Join(dir, "kernel", "drivers")
	if err := os.MkdirAll(kdir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A tiny relocatable ELF with a .modinfo section, from the host's gcc.
	src := filepath.Join(dir, "m.c")
	os.WriteFile(src, []byte(`__attribute__((section(".modinfo"))) const char mi[] = "license=GPL\0depends=\0name=virtio_net";`), 0o644)
	obj := filepath.Join(kdir, "virtio_net.ko")
	if out, err := exec.Command("gcc", "-c", "-o", obj, src).CombinedOutput(); err != nil {
		t.Skipf("gcc: %v %s", err, out)
	}
	if out, err := exec.Command("xz", obj).CombinedOutput(); err != nil {
		t.Fatalf("xz: %v %s", err, out)
	}
	os.WriteFile(filepath.Join(dir, "modules.builtin"), []byte("kernel/drivers/virtio/virtio_pci.ko\n"), 0o644)
	mods, err := moduleOrder(dir, []string{"virtio_pci", "virtio_net"})
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) != 1 || mods[0].name != "virtio_net" || !strings.HasSuffix(mods[0].path, ".ko.xz") {
		t.Fatalf("moduleOrder = %+v; want only virtio_net from its .ko.xz", mods)
	}
	b, err := readModule(mods[0].path)
	if err != nil || len(b) < 4 || string(b[:4]) != "\x7fELF" {
		t.Fatalf("readModule: %v (%d bytes)", err, len(b))
	}
	if _, err := moduleOrder(dir, []string{"virtio_blk"}); err == nil || !strings.Contains(err.Error(), "virtio_blk not found") {
		t.Errorf("missing module: %v", err)
	}
}

func TestWholeELF(t *testing.T) {
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Skip(err)
	}
	if !wholeELF(self) {
		t.Fatal("the test binary is not a whole ELF")
	}
	if wholeELF(self[:len(self)-1]) || wholeELF(self[:len(self)/2]) || wholeELF(nil) || wholeELF([]byte("not an elf at all, not at all, not at all, not at all, really.")) {
		t.Error("a cut ELF passed")
	}
}

// The two forwards of a boot must not share a port: QEMU refuses to start.
func TestFreePortsDistinct(t *testing.T) {
	for range 20 {
		ports, err := freePorts(8)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int]bool{}
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("port %d handed out twice in %v", p, ports)
			}
			seen[p] = true
		}
	}
	if !portTaken([]byte("qemu-system-x86_64: -netdev user,id=n0: Could not set up host forwarding rule 'tcp:127.0.0.1:4000-:7070'")) {
		t.Error("QEMU's refusal of a taken port not recognised")
	}
}
