package vm

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// xzMagic starts the xz stream a Debian bzImage carries its kernel in.
var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}

// Vmlinux returns the uncompressed kernel ELF of k, extracted once from
// vmlinuz (the image's System.map is a placeholder and the ELF has no
// symbol table: symbols come from the running kernel's kallsyms). The xz
// stream uses the x86 BCJ filter, so it is decompressed with xz(1).
func (k *Kernel) Vmlinux() (string, error) {
	out := filepath.Join(filepath.Dir(filepath.Dir(k.Vmlinuz)), "vmlinux-"+k.Release)
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	z, err := os.ReadFile(k.Vmlinuz)
	if err != nil {
		return "", err
	}
	i := bytes.Index(z, xzMagic)
	if i < 0 {
		return "", fmt.Errorf("%s: no xz-compressed kernel inside", k.Vmlinuz)
	}
	cmd := exec.Command("xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(z[i:])
	elf, err := cmd.Output()
	if len(elf) < 4 || !bytes.Equal(elf[:4], []byte("\x7fELF")) {
		return "", fmt.Errorf("xz -d of %s: %v (install xz-utils)", k.Vmlinuz, err)
	}
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, elf, 0o644); err != nil {
		return "", err
	}
	return out, os.Rename(tmp, out)
}

// Kernel returns the kernel the instance booted, from the cache.
func (in *Instance) Kernel(cache string) *Kernel {
	pkg := "linux-image-" + in.st.Release
	root := filepath.Join(cache, "kernel", pkg)
	return &Kernel{Package: pkg, Release: in.st.Release, Vmlinuz: filepath.Join(root, "boot", "vmlinuz-"+in.st.Release),
		Modules: filepath.Join(root, "lib", "modules", in.st.Release)}
}
