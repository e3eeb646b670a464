package main

import (
	"context"
	"strconv"
	"strings"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var unwindCommand = &command{
	name:    "unwind",
	summary: "user-space unwinding: DWARF CFI tables and stacks of live processes",
	help:    `Neither needs kerninstd.`,
	sub:     []*command{unwindTableCommand, unwindStackCommand},
}

var unwindTableCommand = &command{
	name:    "table",
	args:    "BINARY",
	summary: "DWARF CFI compiled into unwind rows (readelf's frames-interp notation)",
	help: `The DWARF CFI (.eh_frame, .debug_frame) of an x86-64 ELF file compiled into
rows, one per pc where a rule changes, in the notation of readelf
--debug-dump=frames-interp (CFA rsp+8, saved at c-16, u = undefined, exp =
DWARF expression; CFA u = no FDE covers the range).`,
	report: true, files: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		pcArg := fs.String("pc", "", "only the row in effect at this link-time `address` (hex)")
		var so cli.SymbolOptions
		noDemangleFlag(fs, &so.NoDemangle)
		var asJSON bool
		jsonFlag(fs, &asJSON, "the table")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one BINARY")
			}
			var pc *uint64
			if *pcArg != "" {
				// Hex, as the help says, with or without 0x: readelf's
				// and objdump's addresses are printed without it.
				v, err := strconv.ParseUint(strings.TrimPrefix(strings.ToLower(*pcArg), "0x"), 16, 64)
				if err != nil {
					return 2, usagef("--pc %q: want a hex address such as 0x1139", *pcArg)
				}
				pc = &v
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.ShowUnwindTable(inv.args[0], pc, asJSON, env.Out, so) })
		}
	},
}

var unwindStackCommand = &command{
	name:    "stack",
	args:    "PID",
	summary: "user stacks of a live process, without frame pointers where CFI is available",
	help: `The user stacks of a process's threads, unwound with their binaries' CFI
and frame pointers where it is missing, named by the files' symbols.
Without --ptrace only threads blocked in the kernel unwind (SP and PC from
/proc/PID/task/TID/syscall), and they are left asleep. A kernel thread
has no user stack: its kernel stack (/proc/PID/task/TID/stack, readable by
root) is shown instead.

Each frame shows its source file:line when the binary has DWARF line
tables or a separate debug file. Separate debug files name the internal
functions of stripped libraries (Debian's -dbg/-dbgsym packages): they are
looked for as /usr/lib/debug/.build-id/xx/rest.debug, through
.gnu_debuglink (CRC checked), then from the debuginfod servers in
DEBUGINFOD_URLS (DEBUGINFOD_TIMEOUT seconds a request, 5 by default, 15 s
in all), kept in $KINST_CACHE/debuginfod or ~/.cache/kinst/debuginfod.
Go binaries without DWARF or CFI (-ldflags=-w) unwind by their .gopclntab.`,
	report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var tid int
		tidFlag(fs, &tid, "only this thread")
		var so cli.SymbolOptions
		noDemangleFlag(fs, &so.NoDemangle)
		usePtrace := fs.Bool("ptrace", false, "stop each thread briefly to read all its registers (else only threads blocked in the kernel unwind)")
		var asJSON bool
		jsonFlag(fs, &asJSON, "the stacks")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("want one PID")
			}
			pid, err := strconv.Atoi(inv.args[0])
			if err != nil || pid <= 0 {
				return 2, usagef("PID %q is not a process id", inv.args[0])
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.ShowUnwindStack(pid, tid, *usePtrace, asJSON, env.Out, so) })
		}
	},
}

// noDemangleFlag is --no-demangle, as perf's.
func noDemangleFlag(fs *pflag.FlagSet, p *bool) {
	fs.BoolVar(p, "no-demangle", false, "keep C++ and Rust symbol names mangled (by default they read as `c++filt -i` prints them: Rust legacy ::h<hash> suffixes and v0 crate disambiguators dropped, as rustfilt does)")
}
