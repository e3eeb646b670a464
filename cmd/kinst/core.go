package main

import (
	"context"
	"os"
	"strconv"
	"strings"

	"github.com/kinst/kinst/app/cli"
	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/dump"
	"github.com/spf13/pflag"
)

const coreHelp = `Postmortem analysis of a kernel crash dump (ELF vmcore from QEMU
dump-guest-memory or kdump, kdump-compressed, FreeBSD minidump, or the
running kernel's /proc/kcore), with
symbols, types and unwind tables taken from the dump itself.

Commands:
  info            format, kernel release, KASLR offset, memory (RAM and dumped),
                  CPUs, panic message; if the tasks or the log cannot be read
                  it lists why ("errors" in JSON) and exits 1
  ps              every task: pid, tgid, cpu, state, comm ('>' marks running)
  bt [PID|TASK|-a]
                  kernel stack of a task (by pid or task_struct address),
                  or of every task (ORC unwinding); with neither, the
                  tasks that panicked or oopsed (panic, crash_kexec or
                  oops_end on their stacks), as crash's bt shows the panic
                  task
  log             the printk ring buffer (dmesg)
  rd ADDR|SYM[+0xOFF] [N]
                  hex dump of N bytes (default 64) of kernel virtual memory
                  (--phys: ADDR is a physical address)
  sym ADDR|NAME   the symbol at an address, or a symbol's address
  dis FUNC        disassemble a function from the dump's memory
  slabs           every slab cache (SLUB): sizes, aliases, slabs, objects
                  allocated and free, found by walking the memory map
  whattype ADDR|SYM[+0xOFF]
                  what an address is: a slab object (cache, object, state,
                  type and member), a task's stack, a symbol, a page;
                  an object of a kmalloc or merged cache is typed by the
                  type graph, with the chain of pointers that did it
                  (--graph=false: only by its cache)
  kmem ADDR       whattype, as crash spells it
  search VALUE…   every aligned quadword of the dumped memory equal to a
                  value (crash's search -k), at the kernel address it is
                  seen at (the kernel image, a task's stack, the direct
                  map) and what holds it (whattype): who still points at
                  an object; the first 10,000 hits
  typegraph       every heap object's type, propagated from the caches
                  that hold one struct and the per-CPU variables through
                  pointer members (passes: conservative, arrays,
                  coalescence, inference); --hold-out CACHE,… measures
                  the inference on caches whose type is known
  istype ADDR TYPE
                  typegraph with the object at ADDR set to struct TYPE by
                  hand: how many more objects the graph then types (with
                  --graph-file: on the saved graph, propagating from that
                  object and rerunning the later passes over the untyped
                  objects only; the graph is written back)
  findlocks       held mutexes, rwsems and spinlocks in typed memory,
                  with the owner task and the waiters
  findfalse       arrays of structs smaller than a cache line holding a
                  lock, seqlock or wait queue head (false sharing)
  findleaks       slab objects no pointer reaches (mdb's ::findleaks):
                  every word of the kernel's data, each CPU's per-CPU
                  area, each task's stack and each vmalloc area (modules
                  among them) marks the object it points into, and each
                  marked object's words mark further; the allocated
                  objects left are leaks, grouped by cache and type, each
                  counted once at the object that hides the others
                  (--verbose lists each). Conservative: a stale word keeps
                  an object, so a leak is missed rather than invented,
                  except for objects only memory outside the heap,
                  vmalloc and those roots points at (boot-time tables)
  p EXPR          the value of a C expression, as crash's print: globals,
                  per-CPU variables (per_cpu(VAR, CPU); alone, CPU 0's),
                  members (. ->), [i], * and &, casts ((struct T *)ADDR;
                  (struct T)ADDR is the struct at ADDR), container_of(P,
                  struct T, MEMBER), sizeof, + and -. Structs print
                  nested, enums by name, char arrays as strings, pointers
                  with the symbol they point to. BTF types per-CPU
                  variables only: other globals need a cast, or
                  --vmlinux with the debug vmlinux (its DWARF)
  struct T ADDR   the struct T at ADDR (an address, a symbol or an
                  expression), every member or -m M,… (T.M,… as crash)
  list T.MEMBER -H HEAD
                  the structs T linked through MEMBER from HEAD (an
                  expression: init_task.tasks), one address a line, with
                  -s M,… their members. MEMBER's type says what HEAD is:
                  a list_head (back to HEAD), an hlist_node (from an
                  hlist_head, to NULL), an rb_node (an rb_root, in
                  order); a list that loops or breaks is reported where.
  list T -H XA    the structs T an xarray (or an IDR) points to, in index
                  order: -H names the struct xarray or idr
                  (init_pid_ns.idr: every struct pid)
  files PID|TASK  a task's open files: fd, struct file, dentry, inode,
                  type and path (through the mounts, as d_path)
  vm PID|TASK     a task's address space, as crash's vm: its mm_struct and
                  each VMA (struct, range, permissions and file offset as
                  /proc/PID/maps, the mapped file's path), from the maple
                  tree mm_mt (6.1+) or the mmap list before it
  mount           the mounts of init's namespace: struct mount, super
                  block, file system type, device and mount point
  shell           the type graph built (or loaded) once, then commands
                  from stdin, one a line: whattype ADDR, istype ADDR TYPE,
                  reach, typegraph, findleaks [-v], p EXPR, struct T ADDR [-m M,…],
                  list T.MEMBER HEAD [-s M,…], save FILE, quit (--json: one JSON
                  value a line)

A saved graph (--graph-file FILE) is the type graph in a compact binary
file: each object's type, mark and pass, every pointer claim (the chains
of inference), the conflicts and the report, with the identity of the
heap it was built on (VMCOREINFO, BTF, every slab and which objects are
free). A second typegraph, whattype, findlocks or findfalse loads it
instead of running the passes (the slabs are walked again to check the
identity); a file of another dump, or a damaged one, is refused and left
as it is. A live kernel's heap moves: it has no saved graph.

The running kernel: DUMP /proc/kcore, or --live and no DUMP, reads the
live system's memory (as root; Linux 4.19+, whose kcore carries
VMCOREINFO): every command works as on a dump. Memory changes
while it is read: a list cut by a task exiting, a slab freed under the
walk, is skipped and counted ("anomalies"), never followed forever; a
task running on a CPU has no registers to unwind from (bt says so).
Types come from the kernel's memory, else /sys/kernel/btf/vmlinux.

FreeBSD amd64 minidumps: info (header, memory, pages), log (the message
buffer, oldest line first) and rd ADDR (through the dump's pmap and
direct map, or --phys) work; ps, bt, sym and dis need the FreeBSD
kernel's symbols and types, which are not read yet.`

var coreCommand = &command{
	name:    "core",
	args:    "DUMP info|ps|bt [PID|TASK|-a]|log|rd ADDR [N]|sym ADDR|NAME|dis FUNC|slabs|whattype ADDR|typegraph|istype ADDR TYPE|findlocks|findfalse|findleaks|p EXPR|struct T ADDR|list T.MEMBER -H HEAD|files PID|vm PID|mount|kmem ADDR|search VALUE…|shell",
	summary: "postmortem analysis of a kernel crash dump",
	help:    coreHelp,
	report:  true, files: true, words: []string{"info", "ps", "bt", "log", "rd", "sym", "dis", "slabs", "whattype", "typegraph", "istype", "findlocks", "findfalse", "findleaks", "p", "struct", "list", "files", "vm", "mount", "kmem", "search", "shell"},
	setup: func(fs *pflag.FlagSet) runFunc {
		var asJSON bool
		jsonFlag(fs, &asJSON, "the result")
		all := fs.BoolP("all", "a", false, "bt: every task")
		btfFile := fs.String("btf", "", "take types from `FILE` (raw BTF, or an ELF with .BTF) instead of the dump")
		vmlinux := fs.String("vmlinux", "", "take types (.BTF) and unwind tables (.orc_unwind*) from the kernel image `FILE` instead of the dump")
		phys := fs.Bool("phys", false, "rd: ADDR is a physical address")
		holdOut := fs.StringSlice("hold-out", nil, "typegraph: treat the caches `CACHE,…` as untyped and measure how the inference types their objects")
		graphFile := fs.String("graph-file", "", "typegraph, istype, whattype, findlocks, findfalse, findleaks, shell: the type graph saved in `FILE`: loaded when it is this dump's (else refused), built and written there when FILE does not exist; istype changes it incrementally and writes it back")
		live := fs.Bool("live", false, "read the running kernel's memory (/proc/kcore, as root) instead of a dump: DUMP is left out")
		maxFrames := fs.Int("max-frames", 0, "bt: stop a stack after `N` frames (0: no limit; a cycle of frames still ends it)")
		members := fs.StringSliceP("members", "m", nil, "struct: print only the members `M,…` (paths such as se.vruntime)")
		head := fs.StringP("head", "H", "", "list: where the list starts (a list_head, hlist_head or rb_root, as MEMBER's type says): an `EXPR` (init_task.tasks, a symbol, an address)")
		show := fs.StringSliceP("show", "s", nil, "list: print the members `M,…` of each entry")
		verbose := fs.BoolP("verbose", "v", false, "findleaks: list every leak, not only the totals of each cache and type")
		graph := fs.Bool("graph", true, "whattype: type an object its cache does not by the type graph (kmalloc and merged caches); --graph=false: the cache's type only")
		return func(ctx context.Context, inv invocation) (int, error) {
			args := inv.args
			if *live {
				args = append([]string{dump.KcorePath}, args...)
			}
			if len(args) < 2 {
				return 2, usagef("want DUMP COMMAND (or --live COMMAND)")
			}
			path, cmd, rest := args[0], args[1], args[2:]
			nargs := func(lo, hi int) error {
				if len(rest) < lo || len(rest) > hi {
					return usagef("core %s: wrong number of arguments", cmd)
				}
				return nil
			}
			req := cli.CoreRequest{Dump: path, Command: cmd, Length: 64, Phys: *phys, JSON: asJSON,
				Options: core.Options{BTF: *btfFile, Vmlinux: *vmlinux, MaxFrames: *maxFrames}, HoldOut: *holdOut, Graph: *graph,
				GraphFile: *graphFile, In: os.Stdin, Verbose: *verbose}
			switch cmd {
			case "info", "ps", "log", "slabs", "typegraph", "findlocks", "findfalse", "findleaks", "mount", "shell":
				if err := nargs(0, 0); err != nil {
					return 2, err
				}
			case "bt":
				hi := 1
				if *all {
					hi = 0
				}
				if err := nargs(0, hi); err != nil {
					return 2, err
				}
				req.All = *all
				req.Panicked = !*all && len(rest) == 0
				if !*all && len(rest) == 1 {
					v, err := strconv.ParseUint(rest[0], 0, 64)
					if err != nil || (v > 1<<31 && v < 0xffff800000000000) {
						return 2, usagef("core bt: %q is neither a PID nor a task_struct address", rest[0])
					}
					req.Which = v
				}
			case "rd":
				if err := nargs(1, 2); err != nil {
					return 2, err
				}
				req.Arg = rest[0]
				if len(rest) == 2 {
					v, err := strconv.ParseUint(rest[1], 0, 32)
					if err != nil {
						return 2, usagef("core rd: bad length %q", rest[1])
					}
					req.Length = int(v)
				}
			case "istype":
				if err := nargs(2, 2); err != nil {
					return 2, err
				}
				req.Arg, req.TypeName = rest[0], strings.TrimPrefix(rest[1], "struct ")
			case "files", "vm":
				if err := nargs(1, 1); err != nil {
					return 2, err
				}
				v, err := strconv.ParseUint(rest[0], 0, 64)
				if err != nil {
					return 2, usagef("core %s: %q is neither a PID nor a task_struct address", cmd, rest[0])
				}
				req.Which = v
			case "p":
				if len(rest) == 0 {
					return 2, usagef("core p: want an expression")
				}
				req.Arg = strings.Join(rest, " ")
			case "struct":
				if err := nargs(2, 2); err != nil {
					return 2, err
				}
				req.TypeName, req.Arg, req.Members = rest[0], rest[1], *members
			case "list":
				if err := nargs(1, 1); err != nil {
					return 2, err
				}
				if *head == "" {
					return 2, usagef("core list: -H HEAD names the list_head (or xarray) to start at")
				}
				req.TypeName, req.Head, req.Members = rest[0], *head, *show
			case "search":
				if len(rest) == 0 {
					return 2, usagef("core search: give one or more values (a leaked object's address, say)")
				}
				for _, a := range rest {
					v, err := strconv.ParseUint(strings.TrimPrefix(a, "0x"), 16, 64)
					if err != nil {
						return 2, usagef("core search: %q is not a hex value", a)
					}
					req.Values = append(req.Values, v)
				}
			case "kmem":
				// crash's spelling of whattype.
				cmd, req.Command = "whattype", "whattype"
				if err := nargs(1, 1); err != nil {
					return 2, err
				}
				req.Arg = rest[0]
			case "sym", "dis", "whattype":
				if err := nargs(1, 1); err != nil {
					return 2, err
				}
				req.Arg = rest[0]
			default:
				return 2, usagef("unknown command %q", cmd)
			}
			if *graphFile != "" && !strings.Contains(" typegraph istype whattype findlocks findfalse findleaks shell ", " "+cmd+" ") {
				return 2, usagef("core %s: --graph-file is a typegraph, istype, whattype, findlocks, findfalse, findleaks and shell flag", cmd)
			}
			if *verbose && cmd != "findleaks" {
				return 2, usagef("core %s: --verbose is a findleaks flag", cmd)
			}
			if len(*holdOut) > 0 && cmd != "typegraph" && cmd != "istype" && cmd != "shell" {
				return 2, usagef("core %s: --hold-out is a typegraph flag", cmd)
			}
			if fs.Changed("graph") && cmd != "whattype" {
				return 2, usagef("core %s: --graph is a whattype flag", cmd)
			}
			if len(*members) > 0 && cmd != "struct" {
				return 2, usagef("core %s: -m/--members is a struct flag", cmd)
			}
			if (*head != "" || len(*show) > 0) && cmd != "list" {
				return 2, usagef("core %s: -H/--head and -s/--show are list flags", cmd)
			}
			if *phys && cmd != "rd" {
				return 2, usagef("core %s: --phys is an rd flag", cmd)
			}
			return inv.reportErr(asJSON, func(env cli.Env) error { return cli.Core(req, env.Out) })
		}
	},
}
