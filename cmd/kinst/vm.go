package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/app/vm"
	"github.com/spf13/pflag"
)

const vmUsage = `vm up     [--cache DIR] [--smp N] [--memory MB] [--accel auto|tcg|tcg-single|kvm] [--kerninstd PATH]
  vm exec   -- CMD [ARGS…]     run CMD in the guest; exit with its status
  vm status [--json]
  vm dump   FILE [--format elf|kdump-zlib|kdump-lzo|kdump-snappy]
                               write a crash dump of the guest (for kinst core)
  vm down

KINST_VM_STATE=DIR keeps a VM's state in DIR instead of CACHE/vm, so
several VMs can run beside each other on one cache.`

func vmCmd(ctx context.Context, args []string) (int, error) {
	if len(args) == 0 {
		return 2, fmt.Errorf("usage: kinst %s", vmUsage)
	}
	fs := pflag.NewFlagSet("vm "+args[0], pflag.ContinueOnError)
	fs.SortFlags = false
	fs.Usage = func() { fmt.Fprintf(os.Stderr, "Usage: kinst %s\n\n%s", vmUsage, fs.FlagUsages()) }
	cache := fs.String("cache", defaultCache(), "cache `dir` for the kernel, module and initramfs (env KINST_CACHE)")
	switch args[0] {
	case "up":
		c := vm.Config{Progress: os.Stderr}
		fs.IntVar(&c.SMP, "smp", 2, "virtual CPUs")
		fs.IntVar(&c.MemoryMB, "memory", 1024, "guest memory in MiB")
		fs.StringVar(&c.Accel, "accel", "auto", "auto (KVM only if a probe boots), tcg (multi-threaded), tcg-single (one host thread: slower, but safe for the kernel's own text pokes such as tracefs kprobes) or kvm")
		kd := fs.String("kerninstd", "", "static kerninstd binary for the guest (default: next to kinst)")
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		self, err := os.Executable()
		if err != nil {
			return 1, err
		}
		c.CacheDir, c.StateDir, c.KinstBin, c.KerninstdBin = *cache, stateDir(*cache), self, *kd
		if c.KerninstdBin == "" {
			c.KerninstdBin = filepath.Join(filepath.Dir(self), "kerninstd")
		}
		c.Ready = waitKerninstd
		start := time.Now()
		in, err := vm.Up(ctx, c)
		if err != nil {
			return 1, err
		}
		fmt.Printf("VM up in %.1fs (%s, kernel %s)\n", time.Since(start).Seconds(), in.Accel(), in.KernelRelease())
		fmt.Printf("  run in the guest:   kinst vm exec -- kinst count lookuppn\n")
		fmt.Printf("  kerninstd from here: KINST_ADDR=%s kinst count lookuppn\n", in.KerninstdAddr())
		fmt.Printf("  serial log:         %s\n  QMP:                %s\n  stop it:            kinst vm down\n", in.SerialLog(), in.QMPSocket())
		return 0, nil
	case "exec":
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		argv := fs.Args()
		if len(argv) == 0 {
			return 2, errors.New("vm exec: want -- CMD [ARGS…]")
		}
		in, err := vm.Attach(stateDir(*cache))
		if err != nil {
			return 1, err
		}
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
		defer stop()
		status, err := in.Exec(ctx, argv, os.Stdout, os.Stderr)
		if ctx.Err() != nil {
			return 130, nil // interrupted; the guest command got SIGINT
		}
		return status, err
	case "status":
		asJSON := fs.Bool("json", false, "print JSON")
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		in, err := vm.Attach(stateDir(*cache))
		if err != nil {
			return 1, err
		}
		st := api.VMStatus{KernelRelease: in.KernelRelease(), Accel: in.Accel(), Kerninstd: in.KerninstdAddr(),
			Agent: in.AgentAddr(), SerialLog: in.SerialLog(), QMP: in.QMPSocket()}
		if *asJSON {
			return 0, json.NewEncoder(os.Stdout).Encode(st)
		}
		for _, kv := range [][2]string{{"kernel_release", st.KernelRelease}, {"accel", st.Accel}, {"kerninstd", st.Kerninstd},
			{"agent", st.Agent}, {"serial_log", st.SerialLog}, {"qmp", st.QMP}} {
			fmt.Printf("%-15s %v\n", kv[0], kv[1])
		}
		return 0, nil
	case "dump":
		format := fs.String("format", "elf", "dump `format`: elf, kdump-zlib, kdump-lzo or kdump-snappy")
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		if fs.NArg() != 1 {
			return 2, fmt.Errorf("vm dump: want FILE")
		}
		in, err := vm.Attach(stateDir(*cache))
		if err != nil {
			return 1, err
		}
		start := time.Now()
		if err := in.Dump(fs.Arg(0), *format); err != nil {
			return 1, err
		}
		fmt.Fprintf(os.Stderr, "vm dump: %s (%s) in %.1fs; read it with kinst core %s info\n", fs.Arg(0), *format, time.Since(start).Seconds(), fs.Arg(0))
		return 0, nil
	case "down":
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		in, err := vm.Attach(stateDir(*cache))
		if err != nil {
			return 1, err
		}
		return 0, in.Down(ctx)
	case "agent":
		listen := fs.String("listen", ":7071", "listen `address` (guest side of vm exec)")
		if err := fs.Parse(args[1:]); err != nil {
			return 2, err
		}
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return 1, err
		}
		return 0, vm.ServeAgent(ctx, ln)
	}
	return 2, fmt.Errorf("usage: kinst %s", vmUsage)
}

// waitKerninstd is vm.Up's readiness check: the guest's kerninstd answers.
func waitKerninstd(ctx context.Context, in *vm.Instance) error {
	return api.NewClient(in.KerninstdAddr()).WaitReady(ctx, 2*time.Minute)
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
