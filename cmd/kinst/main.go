// Command kinst instruments the running kernel through kerninstd, and
// manages the test VM that embeds a stock Debian kernel.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kinst/kinst/kerninstd"
	"github.com/spf13/pflag"
)

const usage = `kinst — dynamic instrumentation of the running kernel (KernInst for x86-64 Linux)

Usage:
  kinst count POINT… [--duration D] [--interval I] [--json] [-- CMD…]
                         live call counts at kernel functions or instructions
  kinst time FUNC… [--pid P|--tid T|--comm C] [--virtual] [--duration D] [--interval I]
             [--plot FILE.svg] [--name N] [--ttl D] [--json] [-- CMD…]
                         calls/s, average and total wall time and
                         concurrency of kernel functions (entry and exits)
  kinst waiters LOCKSYM|0xADDR [--duration D] [--json] [-- CMD…]
                         average tasks waiting for one kernel mutex
  kinst drilldown FUNC [--depth N] -- CMD…
                         time FUNC and its callees over CMD, follow the
                         heaviest callee, repeat: where the time goes
  kinst watch [--interval I]
                         live view of every active metric, like top
  kinst ls [--json]      the live sessions (count and time requests)
  kinst detach NAME|ID   remove a session's instrumentation
  kinst rd ADDR|SYM[+0xOFF] [LEN] [--json]
                         hex dump of live kernel memory
  kinst cfg FUNC [--json | --dot]
                         basic blocks, edges, disassembly, live flags and
                         the splice class of every instruction
  kinst bench splice POINT [--cycles N] [--json]
                         latency of each step of an instrumentation request,
                         and of the same request as a tracefs kprobe
  kinst bench hit [FUNC] [--calls N] [--json]
                         per-hit cost of direct, springboard and trap splices
                         against int3, optimized and BPF kprobes
  kinst bench churn [POINT…] [--function FUNC…] [--cycles N] [--json]
                         cycles of splice, re-splice and unsplice over many
                         points (run a workload alongside to stress them)
  kinst offcpu [-p PID] [--trace] [--duration D] [--folded | --json] [--svg F] [--pprof F]
                         off-CPU profile of this host: where threads wait, as
                         folded stacks, flame graphs and pprof (see --help)
  kinst unwind table BINARY [--pc ADDR] [--json]
                         DWARF CFI compiled into unwind rows (readelf's
                         frames-interp notation)
  kinst unwind stack PID [--tid TID] [--ptrace] [--json]
                         user stacks of a live process, without frame
                         pointers where CFI is available
  kinst core DUMP info|ps|bt PID|TASK|-a|log|rd ADDR [N]|sym ADDR|NAME|dis FUNC|slabs|whattype ADDR [--graph=false]|typegraph [--hold-out CACHE,…]|istype ADDR TYPE|findlocks|findfalse [--json]
                         postmortem analysis of a kernel crash dump
  kinst vm up|exec|down|status
                         the test VM: a stock Debian kernel under QEMU with
                         kerninst.ko and kerninstd running in it

POINT is FUNC (the function's entry: the first instruction after its
ftrace site that a splice can take), FUNC+0xOFF (an instruction boundary),
FUNC:BLOCK (a basic block as kinst cfg numbers them), or a classic name
from the KernInst paper: %s.

Global flags:
  --addr ADDR   kerninstd's unix socket or host:port (env KINST_ADDR;
                default /run/kerninstd.sock)
`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(os.Stderr, usage, classicList())
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var err error
	status := 0
	switch args[0] {
	case "count":
		status, err = countCmd(ctx, args[1:])
	case "time":
		status, err = timeCmd(ctx, args[1:])
	case "waiters":
		status, err = waitersCmd(ctx, args[1:])
	case "drilldown":
		err = drilldownCmd(ctx, args[1:])
	case "ls":
		err = lsCmd(ctx, args[1:])
	case "detach":
		err = detachCmd(ctx, args[1:])
	case "watch":
		err = watchCmd(ctx, args[1:])
	case "rd":
		err = rdCmd(ctx, args[1:])
	case "cfg":
		err = cfgCmd(ctx, args[1:])
	case "bench":
		err = benchCmd(ctx, args[1:])
	case "unwind":
		err = unwindCmd(args[1:])
	case "core":
		err = coreCmd(args[1:])
	case "vm":
		status, err = vmCmd(ctx, args[1:])
	case "offcpu":
		err = offcpuCmd(ctx, args[1:])
	case "workload":
		err = workloadCmd(ctx, args[1:])
	default:
		err = fmt.Errorf("unknown command %q (see kinst --help)", args[0])
		status = 2
	}
	if err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 2
		}
		fmt.Fprintf(os.Stderr, "kinst: %v\n", err)
		if status == 0 {
			status = 1
		}
	}
	return status
}

// newFlags returns a flag set with the global flags.
func newFlags(name, synopsis string) (*pflag.FlagSet, *string) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	addr := fs.String("addr", envOr("KINST_ADDR", kerninstd.DefaultSocket), "kerninstd `address`: unix socket path or host:port")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: kinst %s\n\n%s", synopsis, fs.FlagUsages())
	}
	return fs, addr
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// splitCommand splits the positional arguments at "--": what comes before,
// and the command after (nil without "--").
func splitCommand(fs *pflag.FlagSet) (args, command []string) {
	pos := fs.Args()
	if n := fs.ArgsLenAtDash(); n >= 0 {
		return pos[:n], pos[n:]
	}
	return pos, nil
}
