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
                         against int3 and optimized kprobes
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
	case "rd":
		err = rdCmd(ctx, args[1:])
	case "cfg":
		err = cfgCmd(ctx, args[1:])
	case "bench":
		err = benchCmd(ctx, args[1:])
	case "vm":
		status, err = vmCmd(ctx, args[1:])
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
