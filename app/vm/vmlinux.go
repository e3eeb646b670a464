package vm

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// The compressed streams a Debian bzImage carries its kernel in: xz up
// to 6.1, zstd from 6.12 (CONFIG_KERNEL_ZSTD).
var (
	xzMagic   = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

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
	// The stream is followed by the decompressor's trailer, which both
	// tools call garbage: the ELF is checked whole instead of the status.
	var cmd *exec.Cmd
	var tool string
	if i := bytes.Index(z, xzMagic); i >= 0 {
		cmd, tool = exec.Command("xz", "-dc", "--single-stream"), "xz-utils"
		cmd.Stdin = bytes.NewReader(z[i:])
	} else if i := bytes.Index(z, zstdMagic); i >= 0 {
		cmd, tool = exec.Command("zstd", "-dc"), "zstd"
		cmd.Stdin = bytes.NewReader(z[i:])
	} else {
		return "", fmt.Errorf("%s: no xz- or zstd-compressed kernel inside", k.Vmlinuz)
	}
	elf, err := cmd.Output()
	if !wholeELF(elf) {
		return "", fmt.Errorf("%s of %s: %v (install %s)", cmd.Args[0], k.Vmlinuz, err, tool)
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

// wholeELF reports whether b is an ELF whose section headers and every
// section's bytes are all there: a decompression cut short fails it.
func wholeELF(b []byte) bool {
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil || len(b) < 64 {
		return false
	}
	shoff := binary.LittleEndian.Uint64(b[0x28:])
	shentsize := uint64(binary.LittleEndian.Uint16(b[0x3a:]))
	if shoff == 0 || shoff+shentsize*uint64(len(f.Sections)) > uint64(len(b)) {
		return false
	}
	for _, sec := range f.Sections {
		if sec.Type != elf.SHT_NOBITS && sec.Offset+sec.FileSize > uint64(len(b)) {
			return false
		}
	}
	return true
}
