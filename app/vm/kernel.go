package vm

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Kernel is an extracted Debian kernel image package.
type Kernel struct {
	Package string // e.g. linux-image-6.1.0-56-amd64
	Release string // e.g. 6.1.0-56-amd64
	Vmlinuz string
	Modules string // lib/modules/<release> inside the extraction
}

// fetchKernel downloads (once) and extracts the kernel image package.
func fetchKernel(ctx context.Context, cache, pkg string, say func(string, ...any)) (*Kernel, error) {
	if pkg == "" {
		var err error
		if pkg, err = defaultKernelPackage(ctx); err != nil {
			return nil, err
		}
	}
	pkg, rel, err := kernelPackage(pkg)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cache, "kernel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	root := filepath.Join(dir, pkg)
	k := &Kernel{Package: pkg, Release: rel, Vmlinuz: filepath.Join(root, "boot", "vmlinuz-"+rel),
		Modules: filepath.Join(root, "lib", "modules", rel)}
	if _, err := os.Stat(filepath.Join(root, ".extracted")); err == nil {
		return k, nil
	}
	debs, _ := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if len(debs) == 0 {
		say("downloading %s", pkg)
		if err := aptDownload(ctx, dir, pkg); err != nil {
			return nil, err
		}
		if debs, _ = filepath.Glob(filepath.Join(dir, pkg+"_*.deb")); len(debs) == 0 {
			return nil, fmt.Errorf("apt-get download %s left no .deb in %s", pkg, dir)
		}
	}
	say("extracting %s", filepath.Base(debs[0]))
	tmp := root + ".tmp"
	os.RemoveAll(tmp)
	if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", debs[0], tmp).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	os.RemoveAll(root)
	if err := os.Rename(tmp, root); err != nil {
		return nil, err
	}
	if _, err := os.Stat(k.Vmlinuz); err != nil {
		return nil, fmt.Errorf("%s has no vmlinuz: %w", pkg, err)
	}
	return k, os.WriteFile(filepath.Join(root, ".extracted"), nil, 0o644)
}

// kernelPackage names the image package and its release from either. The
// -unsigned and -dbg packages carry other contents and are refused.
func kernelPackage(s string) (pkg, release string, err error) {
	rel := strings.TrimPrefix(s, "linux-image-")
	switch {
	case rel == "" || strings.ContainsAny(rel, " /_"):
		return "", "", fmt.Errorf("kernel %q: want a Debian kernel package (linux-image-6.12.117+deb12-amd64) or its release (6.12.117+deb12-amd64)", s)
	case strings.HasSuffix(rel, "-dbg") || strings.HasSuffix(rel, "-unsigned"):
		return "", "", fmt.Errorf("kernel %q: name the signed image package (without -dbg or -unsigned)", s)
	case rel[0] < '0' || rel[0] > '9':
		return "", "", fmt.Errorf("kernel %q: a metapackage names no release; give the release, such as 6.12.117+deb12-amd64 (apt-cache depends linux-image-%s)", s, rel)
	}
	return "linux-image-" + rel, rel, nil
}

// defaultKernelPackage asks apt what linux-image-amd64 depends on.
func defaultKernelPackage(ctx context.Context) (string, error) {
	for attempt := 0; attempt < 2; attempt++ {
		out, _ := exec.CommandContext(ctx, "apt-cache", "depends", "linux-image-amd64").Output()
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) == 2 && f[0] == "Depends:" && strings.HasPrefix(f[1], "linux-image-") {
				return f[1], nil
			}
		}
		if attempt == 0 {
			if err := aptUpdate(ctx); err != nil {
				return "", err
			}
		}
	}
	return "", errors.New("apt-cache knows no linux-image-amd64: is this Debian with its package lists?")
}

func aptUpdate(ctx context.Context) error {
	if os.Geteuid() != 0 {
		return errors.New("apt package lists are missing and only root can run apt-get update")
	}
	if out, err := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %v\n%s", err, out)
	}
	return nil
}

// retryAfterUpdate runs an apt command, and once more after refreshing
// the package lists if it failed (a fresh machine may have stale lists).
func retryAfterUpdate(ctx context.Context, cmd func() *exec.Cmd) ([]byte, error) {
	out, err := cmd().CombinedOutput()
	if err != nil {
		if uerr := aptUpdate(ctx); uerr == nil {
			out, err = cmd().CombinedOutput()
		}
	}
	return out, err
}

func aptDownload(ctx context.Context, dir, pkg string) error {
	out, err := retryAfterUpdate(ctx, func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, "apt-get", "download", "-qq", pkg)
		cmd.Dir = dir
		return cmd
	})
	if err != nil {
		return fmt.Errorf("apt-get download %s: %v\n%s", pkg, err, out)
	}
	return nil
}

// ensureHeaders installs the headers matching release if they are missing.
func ensureHeaders(ctx context.Context, release string, say func(string, ...any)) (string, error) {
	dir := filepath.Join("/usr/src", "linux-headers-"+release)
	if _, err := os.Stat(filepath.Join(dir, "Makefile")); err == nil {
		return dir, nil
	}
	pkg := "linux-headers-" + release
	if os.Geteuid() != 0 {
		return "", fmt.Errorf("%s is not installed (apt-get install %s, as root)", dir, pkg)
	}
	say("installing %s", pkg)
	out, err := retryAfterUpdate(ctx, func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "-qq", "--no-install-recommends", pkg)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		return cmd
	})
	if err != nil {
		return "", fmt.Errorf("apt-get install %s: %v\n%s", pkg, err, out)
	}
	return dir, nil
}
