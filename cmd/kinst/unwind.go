package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

const unwindSynopsis = `unwind table BINARY [--pc ADDR] [--json]
       kinst unwind stack PID [--tid TID] [--ptrace] [--json]`

// unwindCmd prints compiled CFI tables and unwinds user stacks of live
// processes; neither needs kerninstd.
func unwindCmd(args []string) error {
	fs := pflag.NewFlagSet("unwind", pflag.ContinueOnError)
	fs.SortFlags = false
	asJSON := fs.Bool("json", false, "print JSON")
	pcArg := fs.String("pc", "", "table: only the row in effect at this link-time `address` (hex)")
	tid := fs.Int("tid", 0, "stack: only this thread")
	usePtrace := fs.Bool("ptrace", false, "stack: stop each thread briefly to read all its registers (else only threads blocked in the kernel unwind, from /proc/PID/task/TID/syscall)")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, `Usage: kinst %s

table: the DWARF CFI (.eh_frame, .debug_frame) of an x86-64 ELF file
compiled into rows, one per pc where a rule changes, in the notation of
readelf --debug-dump=frames-interp (CFA rsp+8, saved at c-16, u =
undefined, exp = DWARF expression; CFA u = no FDE covers the range).

stack: the user stacks of a process's threads, unwound with that CFI
and frame pointers where it is missing, named by the files' symbols.

%s`, unwindSynopsis, fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	a := fs.Args()
	switch {
	case len(a) == 2 && a[0] == "table":
		if *tid != 0 || *usePtrace {
			return fmt.Errorf("unwind table: --tid and --ptrace are for unwind stack")
		}
		var pc *uint64
		if *pcArg != "" {
			v, err := strconv.ParseUint(*pcArg, 0, 64)
			if err != nil {
				return fmt.Errorf("unwind table: --pc %q: want a hex address such as 0x1139", *pcArg)
			}
			pc = &v
		}
		return cli.ShowUnwindTable(a[1], pc, *asJSON, os.Stdout)
	case len(a) == 2 && a[0] == "stack":
		if *pcArg != "" {
			return fmt.Errorf("unwind stack: --pc is for unwind table")
		}
		pid, err := strconv.Atoi(a[1])
		if err != nil || pid <= 0 {
			return fmt.Errorf("unwind stack: PID %q is not a process id", a[1])
		}
		return cli.ShowUnwindStack(pid, *tid, *usePtrace, *asJSON, os.Stdout)
	}
	fs.Usage()
	return fmt.Errorf("unwind: want table BINARY or stack PID")
}
