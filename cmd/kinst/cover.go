package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/kinst/kinst/app/cli"
	"github.com/spf13/pflag"
)

var coverCommand = &command{
	name:    "cover",
	args:    "[TARGET…] [--module MOD] [--callees FUNC [--depth N]] [-- CMD…]",
	summary: "which basic blocks of kernel (or, with --user, a process's) functions run, with probes that remove themselves",
	help: `TARGET is a kernel function or a glob over function names (vfs_*, 'ext4_*');
--module MOD adds every function of a loaded module's text, --callees FUNC
adds FUNC and the functions it calls directly or by tail call, --depth calls
down (the edges kinst cfg --calls lists; indirect calls are not followed).
They combine; each function is covered once.

Every basic block gets one probe, at its cheapest spliceable instruction
(direct < springboard < covering < trap splice), that records its first run
(movb $1 into the counter heap; guarded by --pid or --comm when given).
kerninstd looks at the flags every 50 ms and removes the probes that have run,
in batches, so the overhead falls as coverage saturates. A block that cannot
take a probe is reported with the reason.

Coverage runs until --duration ends, CMD exits (kinst then exits with its
status) or Ctrl-C; then the remaining probes are removed and the report
printed: per function and per block (indices as kinst cfg prints them), and
the live probes over time. --svg FILE draws that timeline: live probes
falling as blocks are covered (the overhead's decay), above blocks covered.

Source lines (each block's "lines", --lcov, --file) come from a debug vmlinux
with DWARF, read by kinst itself: --vmlinux PATH, else the running kernel's,
found by its build id under /usr/lib/debug/.build-id, or as Debian's
linux-image-RELEASE-dbg installs it (/usr/lib/debug/boot/vmlinux-RELEASE,
/usr/lib/debug/lib/modules/RELEASE/vmlinux). Without one the lines stay empty.
A block's lines are the line of its first instruction (as addr2line prints
it), then every line of its bytes, sorted. A module's functions get theirs
from the module's debug file (NAME.ko with DWARF, of the loaded module's
build id): under --module-debug DIR, else Debian's
/usr/lib/debug/lib/modules/RELEASE, else /lib/modules/RELEASE.
--file fs/namei.c --lines 2450-2480 covers the functions holding those lines
and reports only the blocks that hold one of them, as perf probe users name a
source range.

With --user, TARGET names functions of a user process instead (-p PID, or -p 0
-- CMD to start one): FUNC, a glob, LIB:FUNC or LIB:glob (libc:str*); kinst
splices it itself through ptrace and a shared memory file, and looks at the
flags every 50 ms. --callees FUNC (and --depth) follow direct and tail calls
within the executable or library; --file and --lcov read the executable's own
DWARF.

kinst cover report NAME prints a running session's coverage so far;
kinst cover diff A.json B.json compares two saved --json reports;
kinst cover lcov REPORT.json writes a saved report's lcov tracefile.`,
	daemon: true, report: true,
	sub: []*command{coverReportCommand, coverDiffCommand, coverLcovCommand},
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.CoverOptions
		durationFlag(fs, &o.Duration, "stop after this long (default: until Ctrl-C, or until CMD exits)")
		pidFlag(fs, &o.Filter.PID, "cover only this process's execution (its tgid)")
		fs.StringVar(&o.Filter.Comm, "comm", "", "cover only the execution of tasks with this command `name` (up to 15 bytes)")
		fs.StringSliceVar(&o.Modules, "module", nil, "cover every function of the loaded module `MOD`'s text (repeatable; names as lsmod prints them: ext4, virtio_net)")
		fs.StringSliceVar(&o.Callees, "callees", nil, "cover `FUNC` and the functions it calls directly or by tail call (repeatable; see --depth)")
		fs.IntVar(&o.Depth, "depth", 1, "with --callees: follow calls this many `levels` down (1: FUNC and its direct callees)")
		sessionFlags(fs, &o.Name, &o.TTL)
		svgFlag(fs, &o.SVG, "a chart of live probes and covered blocks over time")
		jsonCmdFlag(fs, &o.JSON, "the report")
		fs.StringArrayVar(&o.Files, "file", nil, "cover every function whose code comes from this source `FILE` (fs/namei.c: matched by path suffix; needs the debug vmlinux; a module's as MODULE:FILE, from its debug file); repeatable")
		fs.StringVar(&o.Lines, "lines", "", "with one --file, cover only the source lines `A-B` of it (or one line A): the functions whose code holds any of them, inlined copies included, reported by the blocks of those lines")
		lcovFlag(fs, &o.Lcov)
		vmlinuxFlag(fs, &o.Debug)
		user := fs.Bool("user", false, "cover TARGET (FUNC, a glob, LIB:FUNC or LIB:glob) in the user process -p PID instead of the kernel, or with -p 0 in -- CMD, started and spliced at its entry point (its libraries mapped, none of its code run); the engine runs in kinst through ptrace (no kerninstd); --file and --lcov read the executable's DWARF")
		fs.BoolVar(&o.AllBlocks, "all-blocks", false, "probe every block; by default a block whose coverage follows from its successors' (it runs no call and always goes on into one of them, each of which runs only after it) has no probe and is reported as inferred")
		fs.BoolVar(&o.Trap, "trap", false, "with --user: also probe blocks only a trap splice (int3 and a SIGTRAP handler) fits; refused by default, since a thread that reaches one with SIGTRAP blocked (a starting thread, a fork, code that blocks every signal) dies")
		return func(ctx context.Context, inv invocation) (int, error) {
			o.Targets, o.Command = inv.args, inv.command
			if err := checkKernelPID(fs, "cover", o.Filter.PID, *user); err != nil {
				return 2, err
			}
			if *user {
				pid := o.Filter.PID
				o.Filter.PID = 0
				if !fs.Changed("pid") || pid < 0 || (pid == 0) == (len(o.Command) == 0) {
					return 2, usagef("--user -p PID names a running process, or --user -p 0 with -- CMD a command to start")
				}
				if fs.Changed("depth") && len(o.Callees) == 0 {
					return 2, usagef("--depth goes with --callees FUNC")
				}
				ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
				defer stop()
				return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.CoverProcess(ctx, pid, o, env) })
			}
			if o.Trap {
				return 2, usagef("--trap goes with --user: kernel coverage takes trap splices as it needs them")
			}
			if len(o.Targets) == 0 && len(o.Files) == 0 && len(o.Modules) == 0 && len(o.Callees) == 0 {
				return 2, usagef("name at least one kernel function or glob (vfs_*), --file SRC, --module MOD or --callees FUNC")
			}
			if fs.Changed("depth") && len(o.Callees) == 0 {
				return 2, usagef("--depth goes with --callees FUNC")
			}
			if o.Depth < 1 {
				return 2, usagef("--depth %d: want 1 or more (name FUNC alone as a TARGET to cover just it)", o.Depth)
			}
			return inv.report(o.JSON, func(env cli.Env) (int, error) { return cli.Cover(ctx, inv.client(), o, env) })
		}
	},
}

func lcovFlag(fs *pflag.FlagSet, p *string) {
	fs.StringVar(p, "lcov", "", "also write an lcov tracefile (genhtml's input) to `FILE`; needs the debug vmlinux")
}

func vmlinuxFlag(fs *pflag.FlagSet, o *cli.DebugOptions) {
	fs.StringVar(&o.Vmlinux, "vmlinux", "", "source lines from this debug vmlinux `PATH` (default: the running kernel's, under /usr/lib/debug)")
	fs.StringArrayVar(&o.ModuleDirs, "module-debug", nil, "look for kernel modules' debug files (NAME.ko, NAME.ko.debug) under `DIR` first (repeatable; then /usr/lib/debug/lib/modules/RELEASE and /lib/modules/RELEASE)")
}

var coverReportCommand = &command{
	name:    "report",
	args:    "NAME|ID",
	summary: "a running coverage session's coverage so far",
	help: `Prints the coverage of a running kinst cover session (see kinst ls) as the
final report would show it now; the session goes on.`,
	daemon: true, report: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.CoverReportOptions
		jsonFlag(fs, &o.JSON, "the report")
		lcovFlag(fs, &o.Lcov)
		vmlinuxFlag(fs, &o.Debug)
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("name one coverage session (see kinst ls)")
			}
			o.Session = inv.args[0]
			return inv.reportErr(o.JSON, func(env cli.Env) error { return cli.CoverReport(ctx, inv.client(), o, env) })
		}
	},
}

var coverDiffCommand = &command{
	name:    "diff",
	args:    "A.json B.json",
	summary: "blocks one coverage run covered and the other did not",
	help: `Compares two reports saved by kinst cover --json. Functions are matched by
name, blocks by index and offset in the function, so runs of one kernel build
compare across boots. Lists, per function, the blocks covered in one run
only (with the other run's refusal when it could not probe the block), and
totals. Blocks of a function whose blocks differ between the runs (another
build) are counted as not compared.`,
	report: true, files: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var asJSON bool
		jsonFlag(fs, &asJSON, "the difference")
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 2 {
				return 2, usagef("name two reports of kinst cover --json")
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.CoverDiff(inv.args[0], inv.args[1], asJSON, env) })
		}
	},
}

var coverLcovCommand = &command{
	name:    "lcov",
	args:    "REPORT.json",
	summary: "a saved coverage report as an lcov tracefile, for genhtml",
	help: `Writes the lcov tracefile of a report saved by kinst cover --json. A report
that carries its source lines (a process's, kinst cover --user, from its
binaries' DWARF; a kernel report saved with them) is written as it is.
Otherwise, or with --vmlinux, the lines come from the debug vmlinux
(--vmlinux PATH, else the running kernel's), so that a report taken on one
machine can be annotated on another. Runtime addresses are mapped to the
vmlinux's by the KASLR slide found from the functions' names. Per source file: FN at each function's
first line, FNDA 1 when any of its blocks ran, DA 1 for a line of a covered
block, 0 for a line only uncovered blocks have; lines of refused blocks only
are left out. Functions of modules are left out.

  kinst cover lcov cov.json --vmlinux vmlinux-6.1.0-18-amd64 -o cov.info
  genhtml --no-source cov.info -o html     # or with the sources at the paths`,
	report: true, files: true,
	setup: func(fs *pflag.FlagSet) runFunc {
		var o cli.CoverLcovOptions
		vmlinuxFlag(fs, &o.Debug)
		return func(ctx context.Context, inv invocation) (int, error) {
			if len(inv.args) != 1 {
				return 2, usagef("name one report of kinst cover --json")
			}
			o.Report = inv.args[0]
			return inv.reportErr(false, func(env cli.Env) error { return cli.CoverLcov(o, env) })
		}
	},
}
