package main

import (
	"context"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/kinst/kinst/app/cli"
	"github.com/kinst/kinst/app/vm"
	"github.com/spf13/pflag"
)

var vmCommand = &command{
	name:    "vm",
	summary: "the test VM: a stock Debian kernel under QEMU with kerninst.ko and kerninstd",
	help: `KINST_VM_STATE=DIR keeps a VM's state in DIR instead of CACHE/vm, so
several VMs can run beside each other on one cache.`,
	sub: []*command{vmUpCommand, vmExecCommand, vmStatusCommand, vmDumpCommand, vmDownCommand, vmAgentCommand},
}

// cacheFlag is --cache, which every vm command takes.
func cacheFlag(fs *pflag.FlagSet) *string {
	return fs.String("cache", defaultCache(), "cache `dir` for the kernel, module and initramfs (env KINST_CACHE)")
}

var vmUpCommand = &command{
	name:    "up",
	summary: "boot the test VM and print how to reach it",
	setup: func(fs *pflag.FlagSet) runFunc {
		cache := cacheFlag(fs)
		var c vm.Config
		fs.IntVar(&c.SMP, "smp", 2, "virtual CPUs")
		fs.IntVar(&c.MemoryMB, "memory", 1024, "guest memory in MiB")
		fs.StringVar(&c.Accel, "accel", "auto", "auto (KVM only if a probe boots), tcg (multi-threaded), tcg-single (one host thread: slower, but safe for the kernel's own text pokes such as tracefs kprobes) or kvm")
		valuesOf(fs, "accel", "auto", "tcg", "tcg-single", "kvm")
		kd := fs.String("kerninstd", "", "the static kerninstd binary at `path` for the guest (default: next to kinst)")
		fs.BoolVar(&c.NoDriver, "no-driver", false, "boot without loading kerninst.ko: kerninstd serves count and time with BPF (fentry, kprobe.multi, kprobe), as on a host that refuses modules")
		fs.StringVar(&c.KernelPackage, "kernel", os.Getenv("KINST_KERNEL"), "the Debian kernel to boot: a package (linux-image-6.12.117+deb12-amd64) or its release (6.12.117+deb12-amd64, 6.12.117+deb12-rt-amd64, …); default: what linux-image-amd64 depends on (env KINST_KERNEL)")
		return func(ctx context.Context, inv invocation) (int, error) {
			self, err := os.Executable()
			if err != nil {
				return 1, err
			}
			c.Progress = inv.err
			c.CacheDir, c.StateDir, c.KinstBin, c.KerninstdBin = *cache, stateDir(*cache), self, *kd
			if c.KerninstdBin == "" {
				c.KerninstdBin = filepath.Join(filepath.Dir(self), "kerninstd")
			}
			c.Ready = waitKerninstd
			return 0, cli.VMUp(ctx, c, inv.out)
		}
	},
}

var vmExecCommand = &command{
	name:    "exec",
	args:    "-- CMD [ARGS…]",
	summary: "run CMD in the guest; exit with its status",
	setup: func(fs *pflag.FlagSet) runFunc {
		cache := cacheFlag(fs)
		return func(ctx context.Context, inv invocation) (int, error) {
			argv := append(inv.args, inv.command...)
			if len(argv) == 0 {
				return 2, usagef("want -- CMD [ARGS…]")
			}
			in, err := vm.Attach(stateDir(*cache))
			if err != nil {
				return 1, err
			}
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
			defer stop()
			status, err := in.Exec(ctx, argv, inv.out, inv.err)
			if ctx.Err() != nil {
				return 130, nil // interrupted; the guest command got SIGINT
			}
			return status, err
		}
	},
}

var vmStatusCommand = &command{
	name:    "status",
	summary: "the running VM: kernel, accelerator, kerninstd and agent addresses, logs",
	report:  true,
	setup: func(fs *pflag.FlagSet) runFunc {
		cache := cacheFlag(fs)
		var asJSON bool
		jsonFlag(fs, &asJSON, "the status")
		return func(ctx context.Context, inv invocation) (int, error) {
			in, err := vm.Attach(stateDir(*cache))
			if err != nil {
				return 1, err
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.VMStatus(in, asJSON, env.Out) })
		}
	},
}

var vmDumpCommand = &command{
	name:    "dump",
	args:    "FILE",
	summary: "write a crash dump of the guest (for kinst core)",
	files:   true,
	setup: func(fs *pflag.FlagSet) runFunc {
		cache := cacheFlag(fs)
		format := fs.String("format", "elf", "dump `format`: elf, kdump-zlib, kdump-lzo or kdump-snappy")
		valuesOf(fs, "format", "elf", "kdump-zlib", "kdump-lzo", "kdump-snappy")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want FILE")
			}
			in, err := vm.Attach(stateDir(*cache))
			if err != nil {
				return 1, err
			}
			return 0, cli.VMDump(in, inv.args[0], *format, inv.err)
		}
	},
}

var vmDownCommand = &command{
	name:    "down",
	summary: "stop the test VM",
	setup: func(fs *pflag.FlagSet) runFunc {
		cache := cacheFlag(fs)
		return func(ctx context.Context, inv invocation) (int, error) {
			in, err := vm.Attach(stateDir(*cache))
			if err != nil {
				return 1, err
			}
			return 0, in.Down(ctx)
		}
	},
}

// vmAgentCommand runs in the guest: the other end of kinst vm exec.
var vmAgentCommand = &command{
	name:    "agent",
	summary: "the guest side of kinst vm exec",
	hidden:  true,
	setup: func(fs *pflag.FlagSet) runFunc {
		listen := fs.String("listen", ":7071", "listen `address` (guest side of vm exec)")
		return func(ctx context.Context, inv invocation) (int, error) {
			ln, err := net.Listen("tcp", *listen)
			if err != nil {
				return 1, err
			}
			return 0, vm.ServeAgent(ctx, ln)
		}
	},
}

// waitKerninstd is vm.Up's readiness check: the guest's kerninstd answers.
func waitKerninstd(ctx context.Context, in *vm.Instance) error {
	c, err := in.Client()
	if err != nil {
		return err
	}
	return c.WaitReady(ctx, 2*time.Minute)
}

// stateDir is where the running instance's files live: KINST_VM_STATE, so
// that several VMs can share one cache, or CACHE/vm.
func stateDir(cache string) string {
	if v := os.Getenv("KINST_VM_STATE"); v != "" {
		return v
	}
	return filepath.Join(cache, "vm")
}

func defaultCache() string {
	if v := os.Getenv("KINST_CACHE"); v != "" {
		return v
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kinst")
	}
	return ".cache"
}
