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
	sub: []*command{vmUpCommand, vmExecCommand, vmStatusCommand, vmDumpCommand, vmBisectCommand, vmDownCommand, vmAgentCommand},
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
		fs.StringVar(&c.CPU, "cpu", vm.DefaultCPU, "QEMU's guest CPU `model` under TCG; the default has no cmpxchg16b, whose flags QEMU before 8.0 computes wrongly (qemu64 brings it back, and kerninstd then does not splice)")
		kd := fs.String("kerninstd", "", "the static kerninstd binary at `path` for the guest (default: next to kinst)")
		fs.BoolVar(&c.NoDriver, "no-driver", false, "boot without loading kerninst.ko: kerninstd serves count and time with BPF (fentry, kprobe.multi, kprobe), as on a host that refuses modules")
		fs.StringVar(&c.Append, "append", "", "more of the guest kernel's command `line`, e.g. slub_debug=U,kmalloc-64 to record the owners of one cache's objects (kinst core … findleaks groups leaks by allocating stack)")
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

var vmBisectCommand = &command{
	name:    "bisect",
	args:    "FILE",
	summary: "reduce probe points that hang, oops or crash the test VM to a minimal set",
	help: `FILE lists points, one a line (FUNC, FUNC+0xOFF, FUNC:BLOCK; '#'
starts a comment). Each try boots a fresh test VM (the kernel of --kernel),
arms the points with kinst count while a workload runs for --duration, and
calls the try failed when the kernel logs an oops, BUG or warning, when
QEMU exits (a panic), or when the guest stops answering (a hang: the
vCPUs' pcs are reported). Delta debugging (ddmin) then halves the set, its
halves' complements and finer cuts until no chunk can go; every set is
tried up to --repeat times before it is called passing, because such
failures are races whose odds grow with the number of probes. A try takes
a boot (10 to 40 s) and the duration: a few thousand points take hours.
--dump-dir keeps a dump of each failed guest for kinst core.`,
	report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		cache := cacheFlag(fs)
		var o cli.BisectOptions
		fs.IntVar(&o.Repeat, "repeat", 3, "tries of each set before it is called passing")
		fs.DurationVarP(&o.Trial.Duration, "duration", "d", 20*time.Second, "how long the probes stay in each try")
		fs.DurationVar(&o.Trial.Timeout, "timeout", 0, "a try still running this long after boot, in a guest that no longer answers, is a hang (default: duration + 3m)")
		fs.StringVar(&o.Trial.Workload, "workload", "", "guest shell command run while the probes are in (default: kinst workload syscalls DURATION)")
		fs.StringVar(&o.Trial.DumpDir, "dump-dir", "", "keep a dump of each failed guest in `DIR`")
		fs.StringVar(&o.Trial.Config.KernelPackage, "kernel", os.Getenv("KINST_KERNEL"), "the Debian kernel to boot (as kinst vm up --kernel)")
		fs.StringVar(&o.Trial.Config.Accel, "accel", "tcg", "as kinst vm up --accel")
		fs.IntVar(&o.Trial.Config.MemoryMB, "memory", 1024, "guest memory in MiB")
		jsonFlag(fs, &o.JSON, "the minimal set")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want FILE")
			}
			self, err := os.Executable()
			if err != nil {
				return 1, err
			}
			c := &o.Trial.Config
			c.CacheDir, c.KinstBin, c.KerninstdBin, c.Ready = *cache, self, filepath.Join(filepath.Dir(self), "kerninstd"), waitKerninstd
			o.File = inv.args[0]
			ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
			defer stop()
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.VMBisect(ctx, o, env) })
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
