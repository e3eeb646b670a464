package hostdriver

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/kinst/kinst/output"
)

// Config is a kernel configuration: CONFIG_ name to value ("y", "m", a
// number or a quoted string); options that are "not set" are absent.
type Config map[string]string

// ErrNoConfig is returned when no kernel configuration can be found.
var ErrNoConfig = errors.New("no kernel configuration found")

// ReadConfig reads the running kernel's configuration from
// root/boot/config-RELEASE or, failing that, root/proc/config.gz
// (CONFIG_IKCONFIG_PROC). It returns where it read it.
func ReadConfig(root, release string) (Config, string, error) {
	p := filepath.Join(root, "boot", "config-"+release)
	if b, err := os.ReadFile(p); err == nil {
		c, err := ParseConfig(bytes.NewReader(b))
		return c, p, err
	}
	p = filepath.Join(root, "proc", "config.gz")
	f, err := os.Open(p)
	if err != nil {
		return nil, "", fmt.Errorf("%w (looked for /boot/config-%s and /proc/config.gz)", ErrNoConfig, release)
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %v", p, err)
	}
	c, err := ParseConfig(z)
	return c, p, err
}

// ParseConfig parses a kernel .config.
func ParseConfig(r io.Reader) (Config, error) {
	c := Config{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "CONFIG_") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("kernel config: malformed line %q", line)
		}
		c[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(c) == 0 {
		return nil, errors.New("kernel config: no CONFIG_ options in it")
	}
	return c, nil
}

func (c Config) on(name string) bool { v := c[name]; return v == "y" || v == "m" }

// requirement is a kernel option kinst needs, when it needs it.
type requirement struct {
	output.KernelOption
	// when, if set, limits the requirement to configurations it accepts.
	when func(Config) bool
}

// required are the options without which the driver cannot be loaded or
// kinst cannot splice safely; recommended, those some commands need.
var (
	required = []requirement{
		{KernelOption: output.KernelOption{Name: "CONFIG_X86_64", Why: "kinst splices x86-64 machine code"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_MODULES", Why: "kerninst.ko is a loadable module"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_MODULE_UNLOAD", Why: "`kinst driver unload` removes the module"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_KALLSYMS", Why: "kerninstd finds functions in /proc/kallsyms"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_KALLSYMS_ALL", Why: "kerninstd reads data symbols (module list, per-CPU areas) from /proc/kallsyms"}},
		// Without TASKS_RCU, synchronize_rcu_tasks() is synchronize_rcu(),
		// which proves nothing about a task preempted inside a patch on a
		// preemptible kernel.
		{KernelOption: output.KernelOption{Name: "CONFIG_TASKS_RCU", Why: "a preemptible kernel needs RCU-tasks before a patch may be freed"},
			when: func(c Config) bool { return c.on("CONFIG_PREEMPTION") }},
	}
	recommended = []requirement{
		{KernelOption: output.KernelOption{Name: "CONFIG_DEBUG_INFO_BTF", Why: "types for `kinst time` arguments and `kinst core --live`"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_UNWINDER_ORC", Why: "kernel stacks in `kinst offcpu` and `kinst core bt`"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_KPROBES", Why: "kprobe counts as an oracle and the BPF mechanisms of `kinst bench hit`"}},
		{KernelOption: output.KernelOption{Name: "CONFIG_BPF_SYSCALL", Why: "BPF task iterators for `kinst offcpu` sampling"}},
	}
)

// Missing returns the required and the recommended options c lacks.
func Missing(c Config) (req, rec []output.KernelOption) {
	pick := func(rs []requirement) []output.KernelOption {
		out := []output.KernelOption{}
		for _, r := range rs {
			if (r.when == nil || r.when(c)) && !c.on(r.Name) {
				out = append(out, r.KernelOption)
			}
		}
		return out
	}
	return pick(required), pick(recommended)
}

// ModuleSigForced reports whether the kernel loads only signed modules
// (CONFIG_MODULE_SIG_FORCE), which an unsigned kerninst.ko cannot pass.
func (c Config) ModuleSigForced() bool { return c.on("CONFIG_MODULE_SIG_FORCE") }
