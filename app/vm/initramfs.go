package vm

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cavaliergopher/cpio"

	"github.com/kinst/kinst/driver/linux"
)

// busyboxPath is where busybox-static installs its binary.
const busyboxPath = "/bin/busybox"

// guestModules are the modules the guest needs beyond the built-in
// kernel: the virtio PCI transport and the network device; qemu_fw_cfg,
// through which the kernel hands its VMCOREINFO to QEMU's vmcoreinfo
// device (so dump-guest-memory records it); and evdev, a small module with
// an exception table of its own (its user-memory accesses), so tests meet
// every kind of module table. Their dependencies are added from each
// module's .modinfo.
var guestModules = []string{"virtio_pci", "virtio_net", "qemu_fw_cfg", "evdev"}

// initScript is the guest's /init. kerninstd runs under a restart loop, as
// systemd's Restart=always would run it: a killed daemon comes back (the
// driver restored its splices when the device closed). Its start-up
// whole-kernel analysis is off: under emulation it costs a minute of CPU
// that tests and demos would feel; `kinst cfg --stats` runs it on demand.
const initScript = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
for m in $(cat /etc/kinst/modules); do
	insmod /lib/modules/$m.ko || echo "kinst-init: insmod $m failed"
done
ip link set lo up
for i in 1 2 3 4 5 6 7 8 9 10; do ip link show eth0 >/dev/null 2>&1 && break; sleep 0.2; done
ip addr add 10.0.2.15/24 dev eth0
ip link set eth0 up
ip route add default via 10.0.2.2
if grep -qw kinst.nodriver /proc/cmdline; then
	echo "kinst-init: kinst.nodriver: kerninst.ko not loaded"
else
	insmod /lib/modules/kerninst.ko || echo "kinst-init: insmod kerninst.ko failed"
fi
# The host hands kerninstd's TCP token over fw_cfg (not the command line,
# which dmesg and /proc show); without one kerninstd refuses 0.0.0.0.
tok=/sys/firmware/qemu_fw_cfg/by_name/opt/kinst/token/raw
(umask 077; cat $tok >/run/kinst.token 2>/dev/null) || echo "kinst-init: no token in fw_cfg"
(while :; do kerninstd --socket /run/kerninstd.sock --listen 0.0.0.0:7070 --token-file /run/kinst.token --analyze=false >>/run/kerninstd.log 2>&1; sleep 0.2; done) &
kinst vm agent --listen 0.0.0.0:7071 >>/run/agent.log 2>&1 &
echo "kinst-init: ready"
while :; do sleep 3600; done
`

// readyMarker is what /init prints once everything is started.
const readyMarker = "kinst-init: ready"

// buildInitramfs packs the guest's root file system, cached by content.
func buildInitramfs(cache string, k *Kernel, ko, kinst, kerninstd string) (string, error) {
	mods, err := moduleOrder(k.Modules, guestModules)
	if err != nil {
		return "", err
	}
	type file struct {
		name string
		src  string
		data []byte
		mode cpio.FileMode
	}
	files := []file{
		{name: "init", data: []byte(initScript), mode: 0o755},
		{name: "bin/busybox", src: busyboxPath, mode: 0o755},
		{name: "bin/kinst", src: kinst, mode: 0o755},
		{name: "bin/kerninstd", src: kerninstd, mode: 0o755},
		{name: "lib/modules/kerninst.ko", src: ko, mode: 0o644},
	}
	// The findleaks test module, built beside the driver: there for the
	// live tests to load, never loaded at boot.
	if leak := filepath.Join(filepath.Dir(ko), linux.LeakModule); statOK(leak) {
		files = append(files, file{name: "lib/modules/" + linux.LeakModule, src: leak, mode: 0o644})
	}
	var names []string
	for _, m := range mods {
		b, err := readModule(m.path)
		if err != nil {
			return "", err
		}
		files = append(files, file{name: "lib/modules/" + m.name + ".ko", data: b, mode: 0o644})
		names = append(names, m.name)
	}
	files = append(files, file{name: "etc/kinst/modules", data: []byte(strings.Join(names, "\n") + "\n"), mode: 0o644})
	if err := checkStatic(busyboxPath); err != nil {
		return "", fmt.Errorf("%w (install busybox-static)", err)
	}

	h := sha256.New()
	for i := range files {
		if files[i].data == nil {
			b, err := os.ReadFile(files[i].src)
			if err != nil {
				return "", err
			}
			files[i].data = b
		}
		fmt.Fprintf(h, "%s %o %d\n", files[i].name, files[i].mode, len(files[i].data))
		h.Write(files[i].data)
	}
	dir := filepath.Join(cache, "initramfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, hex.EncodeToString(h.Sum(nil))[:16]+".cpio")
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	for _, d := range []string{"bin", "dev", "etc", "etc/kinst", "lib", "lib/modules", "proc", "sys", "tmp", "run", "root"} {
		if err := w.WriteHeader(&cpio.Header{Name: d, Mode: cpio.TypeDir | 0o755}); err != nil {
			return "", err
		}
	}
	for _, f := range files {
		if err := w.WriteHeader(&cpio.Header{Name: f.name, Mode: cpio.TypeReg | f.mode, Size: int64(len(f.data))}); err != nil {
			return "", err
		}
		if _, err := w.Write(f.data); err != nil {
			return "", err
		}
	}
	if err := w.Close(); err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return "", err
	}
	return out, os.Rename(tmp, out)
}

// checkStatic refuses a binary that needs a dynamic loader: the guest has
// no libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("guest binary %s: %w", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("guest binary %s is dynamically linked; build it with CGO_ENABLED=0", path)
		}
	}
	return nil
}

type module struct {
	name    string
	path    string
	depends []string
}

// readModinfo reads a module's name dependencies from its .modinfo.
func readModinfo(r io.ReaderAt) ([]string, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	b, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// moduleName is the module name of a file under lib/modules: without its
// .ko[.xz|.zst|.gz] suffix, dashes as underscores (as the kernel names it).
func moduleName(file string) (string, bool) {
	for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
		if base, ok := strings.CutSuffix(file, ext); ok {
			return strings.ReplaceAll(base, "-", "_"), true
		}
	}
	return "", false
}

// builtinModules reads modules.builtin: the modules this kernel has built
// in (6.12's Debian image builds virtio_pci in; 6.1's has it as a module).
func builtinModules(dir string) map[string]bool {
	b, _ := os.ReadFile(filepath.Join(dir, "modules.builtin"))
	in := make(map[string]bool)
	for _, l := range strings.Split(string(b), "\n") {
		if n, ok := moduleName(filepath.Base(strings.TrimSpace(l))); ok {
			in[n] = true
		}
	}
	return in
}

// readModule returns a module's ELF bytes. Debian compresses modules from
// 6.12 on (CONFIG_MODULE_COMPRESS_XZ); busybox's insmod hands the kernel
// the bytes as they are, so they are decompressed here.
func readModule(path string) ([]byte, error) {
	var tool string
	switch {
	case strings.HasSuffix(path, ".xz"):
		tool = "xz"
	case strings.HasSuffix(path, ".zst"):
		tool = "zstd"
	case strings.HasSuffix(path, ".gz"):
		tool = "gzip"
	default:
		return os.ReadFile(path)
	}
	out, err := exec.Command(tool, "-dc", path).Output()
	if err != nil {
		return nil, fmt.Errorf("%s -dc %s: %w (install %s)", tool, path, err, tool)
	}
	return out, nil
}

// moduleOrder finds the roots and everything they depend on under dir
// (lib/modules/<release>) and returns them in load order; roots the kernel
// has built in are left out. The Debian image ships no modules.dep, so the
// order comes from .modinfo depends=.
func moduleOrder(dir string, roots []string) ([]module, error) {
	paths := make(map[string]string)
	err := filepath.WalkDir(filepath.Join(dir, "kernel"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if n, ok := moduleName(d.Name()); ok {
				paths[n] = p
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	builtin := builtinModules(dir)
	var need []string
	for _, r := range roots {
		if !builtin[r] {
			need = append(need, r)
		}
	}
	deps := func(name string) (module, error) {
		p, ok := paths[name]
		if !ok {
			return module{}, fmt.Errorf("module %s not found under %s", name, dir)
		}
		b, err := readModule(p)
		if err != nil {
			return module{}, err
		}
		d, err := readModinfo(bytes.NewReader(b))
		if err != nil {
			return module{}, fmt.Errorf("%s: %w", p, err)
		}
		return module{name: name, path: p, depends: d}, nil
	}
	return topoOrder(need, deps)
}

// topoOrder returns roots and their dependencies, dependencies first.
func topoOrder(roots []string, lookup func(string) (module, error)) ([]module, error) {
	var out []module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(string) error
	visit = func(n string) error {
		switch state[n] {
		case 1:
			return fmt.Errorf("module dependency cycle through %s", n)
		case 2:
			return nil
		}
		state[n] = 1
		m, err := lookup(n)
		if err != nil {
			return err
		}
		d := append([]string(nil), m.depends...)
		sort.Strings(d)
		for _, x := range d {
			if err := visit(x); err != nil {
				return err
			}
		}
		state[n] = 2
		out = append(out, m)
		return nil
	}
	for _, r := range roots {
		if err := visit(r); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// statOK says whether path exists.
func statOK(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
