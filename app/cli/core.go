package cli

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/internal/att"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/output"
)

// CoreRequest is one `kinst core DUMP COMMAND [ARGS]`, its arguments
// already checked by the command line.
type CoreRequest struct {
	Dump     string // path of the dump
	Command  string // info, ps, bt, log, rd, sym, dis, slabs, whattype, typegraph, istype, findlocks, findfalse, findleaks, p, struct, list, files, vm, mount or search
	Arg      string // rd, whattype, istype: ADDR|SYM[+0xOFF]; sym: ADDR|NAME; dis: FUNC
	Which    uint64 // bt, files, vm: PID or task_struct address
	All      bool   // bt -a
	Panicked bool   // bt with no task: the tasks with panic on their stacks
	Length   int    // rd: bytes
	Phys     bool   // rd: ADDR is physical
	JSON     bool
	Options  core.Options // Linux: types and ORC from files
	HoldOut  []string     // typegraph, istype: caches treated as untyped
	TypeName string       // istype: the struct the object at Arg is
	Graph    bool         // whattype: type an object its cache does not by the type graph
	// GraphFile: a saved type graph, loaded instead of built when it is
	// this dump's, written when missing (typegraph, istype, whattype,
	// findlocks, findfalse, shell).
	GraphFile string
	In        io.Reader // shell: the commands
	// p: Arg is the expression; struct: TypeName the struct and Arg its
	// address, Members the members to print (all when empty); list:
	// TypeName is STRUCT.MEMBER, Head the list head, Members those to
	// print of each entry.
	Members []string
	Head    string
	Verbose bool // findleaks: every leak
	// Values are search's quadwords.
	Values []uint64
}

// Core opens the dump, decides from its format which kernel it came
// from, and runs the request: a Linux dump through the kernel view
// (core.Kernel), a FreeBSD minidump through core.FreeBSD.
func Core(req CoreRequest, w io.Writer) error {
	d, err := dump.Open(req.Dump)
	if err != nil {
		return err
	}
	if f, ok := core.OpenFreeBSD(d); ok {
		defer d.Close()
		return coreFreeBSD(f, req, w)
	}
	k, err := core.New(d, req.Options)
	if err != nil {
		d.Close()
		return err
	}
	defer k.Close()
	switch req.Command {
	case "info":
		return CoreInfoReport(k, req.JSON, w)
	case "ps":
		return CorePS(k, req.JSON, w)
	case "log":
		return CoreLog(k, req.JSON, w)
	case "bt":
		if req.Panicked {
			return CorePanicBacktrace(k, req.JSON, w)
		}
		return CoreBacktrace(k, req.Which, req.All, req.JSON, w)
	case "rd":
		if req.Phys {
			return corePhysRead(k.Dump, req.Arg, req.Length, req.JSON, w)
		}
		return CoreRead(k, req.Arg, req.Length, req.JSON, w)
	case "sym":
		return CoreSym(k, req.Arg, req.JSON, w)
	case "dis":
		return CoreDis(k, req.Arg, req.JSON, w)
	case "slabs":
		return CoreSlabsReport(k, req.JSON, w)
	case "whattype":
		return CoreWhatType(k, req.Arg, req.Graph, req.GraphFile, req.JSON, w)
	case "typegraph":
		return CoreTypeGraph(k, req.HoldOut, nil, req.GraphFile, req.JSON, w)
	case "istype":
		return CoreTypeGraph(k, req.HoldOut, []string{req.Arg, req.TypeName}, req.GraphFile, req.JSON, w)
	case "findlocks":
		return CoreFindLocks(k, req.GraphFile, req.JSON, w)
	case "findfalse":
		return CoreFindFalse(k, req.GraphFile, req.JSON, w)
	case "findleaks":
		return CoreFindLeaks(k, req.Options.Vmlinux, req.GraphFile, req.Verbose, req.JSON, w)
	case "files":
		return CoreFiles(k, req.Which, req.JSON, w)
	case "mount":
		return CoreMount(k, req.JSON, w)
	case "vm":
		return CoreVM(k, req.Which, req.JSON, w)
	case "p":
		return CorePrint(k, req.Options.Vmlinux, req.Arg, req.JSON, w)
	case "struct":
		return CoreStruct(k, req.Options.Vmlinux, req.TypeName, req.Arg, req.Members, req.JSON, w)
	case "list":
		return CoreList(k, req.Options.Vmlinux, req.TypeName, req.Head, req.Members, req.JSON, w)
	case "shell":
		return CoreShell(k, req.HoldOut, req.GraphFile, req.In, req.JSON, w)
	case "search":
		return CoreSearch(k, req.Values, req.JSON, w)
	}
	return fmt.Errorf("core: unknown command %q", req.Command)
}

// CoreInfoReport prints what the dump is: format, kernel, CPUs, memory,
// and the panic message if the kernel panicked.
func CoreInfoReport(k *core.Kernel, asJSON bool, w io.Writer) error {
	inf := output.CoreInfo{Format: k.Dump.Format(), Release: k.Release(),
		KernelOffset: fmt.Sprintf("%#x", k.Info.KernelOffset), PhysBase: fmt.Sprintf("%#x", k.Info.Numbers["phys_base"]),
		PageTableLevels: 4, KernelOffsetProblem: k.KernelOffsetProblem()}
	if k.Info.Numbers["pgtable_l5_enabled"] == 1 {
		inf.PageTableLevels = 5
	}
	for _, r := range k.Dump.PhysRanges() {
		inf.DumpedBytes += r.End - r.Start
	}
	inf.MemoryBytes = inf.DumpedBytes
	if r, ok := k.Dump.(dump.RAMSizer); ok {
		inf.MemoryBytes = r.RAMBytes()
	}
	if recs, err := k.Log(); err == nil {
		inf.Panic = core.PanicMessage(recs)
	} else {
		inf.Errors = append(inf.Errors, "log: "+err.Error())
	}
	tasks, err := k.Tasks()
	if err != nil {
		inf.Errors = append(inf.Errors, "tasks: "+err.Error())
	}
	for _, c := range k.Dump.CPUs() {
		ci := output.CoreCPUInfo{CPU: c.Index, RIP: fmt.Sprintf("%#x", c.Regs.RIP), PID: -1}
		for _, t := range tasks {
			if t.Active && t.CPU == c.Index {
				ci.PID, ci.Comm = t.PID, t.Comm
			}
		}
		ci.Function = symbolize(k, c.Regs.RIP)
		inf.CPUs = append(inf.CPUs, ci)
	}
	var failed error
	if len(inf.Errors) > 0 {
		failed = fmt.Errorf("info: the report is incomplete: %d part(s) could not be read (listed in it)", len(inf.Errors))
	}
	if asJSON {
		if err := writeJSON(w, inf); err != nil {
			return err
		}
		return failed
	}
	fmt.Fprintf(w, "format:         %s\n", inf.Format)
	fmt.Fprintf(w, "kernel:         %s\n", inf.Release)
	fmt.Fprintf(w, "KASLR offset:   %s\n", inf.KernelOffset)
	if inf.KernelOffsetProblem != "" {
		fmt.Fprintf(w, "  warning:      %s\n", inf.KernelOffsetProblem)
	}
	fmt.Fprintf(w, "phys_base:      %s\n", inf.PhysBase)
	fmt.Fprintf(w, "page tables:    %d levels\n", inf.PageTableLevels)
	if inf.MemoryBytes != inf.DumpedBytes {
		fmt.Fprintf(w, "memory:         %d MiB of RAM, %d MiB dumped in %d ranges\n", inf.MemoryBytes>>20, inf.DumpedBytes>>20, len(k.Dump.PhysRanges()))
	} else {
		fmt.Fprintf(w, "memory:         %d MiB in %d ranges\n", inf.MemoryBytes>>20, len(k.Dump.PhysRanges()))
	}
	if inf.Panic != "" {
		fmt.Fprintf(w, "panic:          %s\n", inf.Panic)
	}
	fmt.Fprintf(w, "CPUs:           %d\n", len(inf.CPUs))
	for _, c := range inf.CPUs {
		who := "?"
		if c.PID >= 0 {
			who = fmt.Sprintf("%d (%s)", c.PID, c.Comm)
		}
		if k.Live() {
			// kcore records no registers: only the task is known.
			fmt.Fprintf(w, "  cpu %d: task %s (live: registers not in /proc/kcore)\n", c.CPU, who)
			continue
		}
		fmt.Fprintf(w, "  cpu %d: task %s at %s %s\n", c.CPU, who, c.RIP, c.Function)
	}
	for _, e := range inf.Errors {
		fmt.Fprintf(w, "unreadable:     %s\n", e)
	}
	return failed
}

// CorePS prints every task: `{"tasks":[{"pid":…,"comm":…,"state":…}]}`.
func CorePS(k *core.Kernel, asJSON bool, w io.Writer) error {
	tasks, err := k.Tasks()
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, output.CoreTasks{Tasks: mapSlice(tasks, coreTask), Anomalies: k.TaskAnomalies()})
	}
	defer func() {
		for _, a := range k.TaskAnomalies() {
			fmt.Fprintf(w, "skipped (changed while read): %s\n", a)
		}
	}()
	fmt.Fprintf(w, "   %7s %7s %3s %2s %-18s %s\n", "PID", "TGID", "CPU", "ST", "TASK", "COMM")
	for _, t := range tasks {
		mark := "  "
		if t.Active {
			mark = "> "
		}
		fmt.Fprintf(w, "%s %7d %7d %3d %2s %#-18x %s\n", mark, t.PID, t.TGID, t.CPU, t.State, t.Addr, t.Comm)
	}
	return nil
}

// CoreBacktrace prints the kernel stack of one task (by PID, or by
// task_struct address), or of every task with all:
// `{"frames":[{"address":"0x…","function":…,"offset":…}]}` for one,
// `{"stacks":[{"task":…,"frames":[…]}]}` for all.
func CoreBacktrace(k *core.Kernel, which uint64, all, asJSON bool, w io.Writer) error {
	if all {
		return writeStacks(k, func(*core.Stack) bool { return true }, asJSON, w)
	}
	var t core.Task
	var err error
	if which >= kernelHalf {
		t, err = k.TaskAt(which)
	} else {
		t, err = k.Task(int(which))
	}
	if err != nil {
		return err
	}
	st, err := k.Backtrace(t)
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, coreStack(st))
	}
	printStack(w, st)
	return nil
}

// panicFrames are the functions a kernel that panicked or oopsed leaves on
// the stack of the task that did it (vpanic since 6.10).
var panicFrames = map[string]bool{"panic": true, "vpanic": true, "nmi_panic": true, "__crash_kexec": true, "crash_kexec": true, "oops_end": true}

// CorePanicBacktrace is bt with no task, as crash's bt shows the panic
// task: the stack of every task with panic (or crash_kexec, or oops_end)
// on it, or an error saying none has.
func CorePanicBacktrace(k *core.Kernel, asJSON bool, w io.Writer) error {
	return writeStacks(k, func(st *core.Stack) bool {
		return slices.ContainsFunc(st.Frames, func(f core.Frame) bool { return panicFrames[f.Function] })
	}, asJSON, w)
}

// writeStacks prints the stacks of every task keep accepts; when keep
// is not everything's and accepts none, it is an error.
func writeStacks(k *core.Kernel, keep func(*core.Stack) bool, asJSON bool, w io.Writer) error {
	tasks, err := k.Tasks()
	if err != nil {
		return err
	}
	var out []*core.Stack
	for _, t := range tasks {
		st, err := k.Backtrace(t)
		if err != nil {
			st = &core.Stack{Task: t, Frames: []core.Frame{}, Stop: err.Error()}
		}
		if keep(st) {
			out = append(out, st)
		}
	}
	if len(out) == 0 && len(tasks) > 0 {
		return errors.New("no task has panic, crash_kexec or oops_end on its stack (a dump of a running kernel?): name a PID or task_struct address, or -a for every task")
	}
	if asJSON {
		return writeJSON(w, output.CoreStacks{Stacks: mapSlice(out, coreStack)})
	}
	for i, st := range out {
		if i > 0 {
			fmt.Fprintln(w)
		}
		printStack(w, st)
	}
	return nil
}

func printStack(w io.Writer, st *core.Stack) {
	t := st.Task
	where := "switched out"
	if t.Active {
		where = fmt.Sprintf("running on cpu %d", t.CPU)
	}
	fmt.Fprintf(w, "PID: %d  TASK: %#x  CPU: %d  COMMAND: %q  STATE: %s (%s)\n", t.PID, t.Addr, t.CPU, t.Comm, t.State, where)
	for i := 0; i < len(st.Frames); i++ {
		f := st.Frames[i]
		name := "?"
		if f.Function != "" {
			name = symName(kernel.Symbol{Name: f.Function, Module: f.Module}, f.Offset)
		}
		exc := ""
		if f.Exception {
			exc = "  (interrupted)"
		}
		fmt.Fprintf(w, " #%-2d %s %s%s\n", i, f.AddrHex, name, exc)
		if p, n := repeatsAfter(st.Frames, i); n > 0 {
			// A recursion: the cycle is printed once, so the frames
			// under it show.
			fmt.Fprintf(w, "     … #%d–#%d repeated %d more times (#%d–#%d)\n", i+1-p, i, n, i+1, i+p*n)
			i += p * n
		}
	}
	if st.UserMode {
		fmt.Fprintf(w, "     (running in user mode: no kernel frames)\n")
	}
	if st.Stop != "" {
		fmt.Fprintf(w, "     (%s)\n", st.Stop)
	}
}

// maxCyclePeriod is the longest run of frames folded as a cycle.
const maxCyclePeriod = 64

// repeatsAfter finds a recursion ending at frame i: the shortest run
// fr[i+1-p:i+1] that the frames after i repeat at least twice. It
// returns p and the number of copies after i, or 0, 0.
func repeatsAfter(fr []core.Frame, i int) (p, n int) {
	for p = 1; p <= maxCyclePeriod && p <= i+1; p++ {
		cycle := fr[i+1-p : i+1]
		n = 0
		for j := i + 1; j+p <= len(fr) && sameFrames(cycle, fr[j:j+p]); j += p {
			n++
		}
		if n >= 2 {
			return p, n
		}
	}
	return 0, 0
}

// sameFrames reports whether two runs of frames name the same code.
func sameFrames(a, b []core.Frame) bool {
	for i := range a {
		if a[i].AddrHex != b[i].AddrHex || a[i].Exception != b[i].Exception {
			return false
		}
	}
	return true
}

// CoreLog prints the printk ring buffer as dmesg does.
func CoreLog(k *core.Kernel, asJSON bool, w io.Writer) error {
	recs, err := k.Log()
	if err != nil {
		return err
	}
	if asJSON {
		return writeJSON(w, output.CoreLog{Records: mapSlice(recs, func(r core.LogRecord) output.CoreLogRecord { return output.CoreLogRecord(r) })})
	}
	for _, r := range recs {
		for _, line := range strings.Split(r.Text, "\n") {
			fmt.Fprintf(w, "[%5d.%06d] %s\n", r.TimeNS/1e9, r.TimeNS%1e9/1e3, line)
		}
	}
	return nil
}

// printMemory prints what rd read.
func printMemory(w io.Writer, m output.CoreMemory, a uint64, b []byte, asJSON bool) error {
	if asJSON {
		return writeJSON(w, m)
	}
	if m.Symbol != "" {
		fmt.Fprintf(w, "%#x <%s>:\n", a, m.Symbol)
	}
	HexDump(w, a, b)
	return nil
}

// rdLength checks rd's length.
func rdLength(n int) error {
	if n <= 0 || n > maxCoreRead {
		return fmt.Errorf("rd: length %d (want 1..%d)", n, maxCoreRead)
	}
	return nil
}

// corePhysRead hex-dumps physical memory (rd --phys); ADDR is a number.
func corePhysRead(d dump.Dump, at string, n int, asJSON bool, w io.Writer) error {
	if err := rdLength(n); err != nil {
		return err
	}
	a, err := strconv.ParseUint(at, 0, 64)
	if err != nil {
		return fmt.Errorf("rd --phys: %q is not a physical address", at)
	}
	b := make([]byte, n)
	got, err := d.ReadPhys(b, a)
	if err != nil {
		// The bytes before the page the dump lacks, as crash's rd
		// shows them, then why it stopped.
		if got > 0 && !asJSON {
			if perr := printMemory(w, output.CoreMemory{Address: fmt.Sprintf("%#x", a), Physical: true, Bytes: hex.EncodeToString(b[:got])}, a, b[:got], false); perr != nil {
				return perr
			}
		}
		return err
	}
	return printMemory(w, output.CoreMemory{Address: fmt.Sprintf("%#x", a), Physical: true, Bytes: hex.EncodeToString(b)}, a, b, asJSON)
}

// resolveAddr parses ADDR (hex or decimal) or SYM[+0xOFF].
func resolveAddr(k *core.Kernel, at string) (uint64, error) {
	if v, err := strconv.ParseUint(at, 0, 64); err == nil {
		return v, nil
	}
	name, offs, _ := strings.Cut(at, "+")
	s, err := k.LookupSymbol(name)
	if err != nil {
		return 0, err
	}
	a := s.Addr
	if offs != "" {
		o, err := strconv.ParseUint(offs, 0, 64)
		if err != nil {
			return 0, fmt.Errorf("bad offset in %q", at)
		}
		a += o
	}
	return a, nil
}

// kernelHalf is where x86-64 kernel addresses begin.
const kernelHalf = 0xffff800000000000

func symbolize(k *core.Kernel, a uint64) string {
	if a < kernelHalf {
		return ""
	}
	if s, off, ok := k.SymbolAt(a); ok {
		return symName(s, off)
	}
	return ""
}

// symName is SYM+0xOFF, with [module] after a module's symbol.
func symName(s kernel.Symbol, off uint64) string {
	if s.Module != "" {
		return fmt.Sprintf("%s+%#x [%s]", s.Name, off, s.Module)
	}
	return fmt.Sprintf("%s+%#x", s.Name, off)
}

// maxCoreRead bounds `rd`.
const maxCoreRead = 1 << 20

// CoreRead hex-dumps kernel virtual memory from the dump.
func CoreRead(k *core.Kernel, at string, n int, asJSON bool, w io.Writer) error {
	if err := rdLength(n); err != nil {
		return err
	}
	a, err := resolveAddr(k, at)
	if err != nil {
		return err
	}
	b, err := k.ReadBytes(a, n)
	if err != nil {
		return err
	}
	return printMemory(w, output.CoreMemory{Address: fmt.Sprintf("%#x", a), Symbol: symbolize(k, a), Bytes: hex.EncodeToString(b)}, a, b, asJSON)
}

// CoreSym resolves an address to SYM+OFF, or a name to its address.
func CoreSym(k *core.Kernel, arg string, asJSON bool, w io.Writer) error {
	if _, err := k.Symbols(); err != nil {
		return err
	}
	var out output.CoreSymbol
	if a, perr := strconv.ParseUint(arg, 0, 64); perr == nil {
		s, off, ok := k.SymbolAt(a)
		if !ok {
			return fmt.Errorf("%#x: %w", a, kernel.ErrNoSymbol)
		}
		out = output.CoreSymbol{Name: s.Name, Module: s.Module, Address: fmt.Sprintf("%#x", s.Addr), Type: string(s.Type), Offset: off, Size: k.SymbolSize(s)}
	} else {
		s, err := k.LookupSymbol(arg)
		if err != nil {
			return err
		}
		out = output.CoreSymbol{Name: s.Name, Module: s.Module, Address: fmt.Sprintf("%#x", s.Addr), Type: string(s.Type), Size: k.SymbolSize(s)}
	}
	if asJSON {
		return writeJSON(w, out)
	}
	mod := ""
	if out.Module != "" {
		mod = " [" + out.Module + "]"
	}
	if out.Offset != 0 {
		fmt.Fprintf(w, "%s (%s) %s+%#x%s\n", arg, out.Type, out.Name, out.Offset, mod)
	} else {
		fmt.Fprintf(w, "%s %s %s%s\n", out.Address, out.Type, out.Name, mod)
	}
	return nil
}

// maxDisBytes bounds a function's disassembly.
const maxDisBytes = 64 << 10

// CoreDis disassembles a function from the dump's memory (AT&T syntax,
// branch targets named).
func CoreDis(k *core.Kernel, fn string, asJSON bool, w io.Writer) error {
	a, err := resolveAddr(k, fn)
	if err != nil {
		return err
	}
	s, off, ok := k.SymbolAt(a)
	if !ok || !s.IsText() {
		return fmt.Errorf("%s is not in a text symbol", fn)
	}
	size := k.SymbolSize(s)
	if size == 0 || size > maxDisBytes {
		size = min(maxDisBytes, 4096)
	}
	code, err := k.ReadBytes(s.Addr, int(size))
	if err != nil {
		return err
	}
	f, err := cfg.Decode(s.Name, "", s.Addr, code)
	if err != nil {
		return err
	}
	symname := func(t uint64) (string, uint64) {
		// Name kernel addresses only: immediates would otherwise match
		// per-CPU offsets, which kallsyms lists as small absolute values.
		if ts, toff, ok := k.SymbolAt(t); ok && t >= kernelHalf {
			return ts.Name, t - toff
		}
		return "", 0
	}
	var out []output.CoreInstruction
	for _, in := range f.Insns {
		out = append(out, output.CoreInstruction{Address: fmt.Sprintf("%#x", in.Addr), Offset: in.Addr - s.Addr,
			Bytes: hex.EncodeToString(in.Bytes), Text: att.Syntax(in.Inst, in.Addr, symname)})
	}
	if asJSON {
		return writeJSON(w, output.CoreDisassembly{Function: s.Name, Address: fmt.Sprintf("%#x", s.Addr), Instructions: out, Truncated: f.Truncated})
	}
	fmt.Fprintf(w, "%s at %#x (%d bytes):\n", s.Name, s.Addr, size)
	for _, in := range out {
		mark := "  "
		if off != 0 && in.Offset == off {
			mark = "=>"
		}
		fmt.Fprintf(w, "%s %s <+%d>:\t%-24s %s\n", mark, in.Address, in.Offset, spaced(in.Bytes), in.Text)
	}
	if f.Truncated {
		fmt.Fprintln(w, "   (undecodable bytes follow)")
	}
	return nil
}

func spaced(h string) string {
	var b strings.Builder
	for i := 0; i+2 <= len(h); i += 2 {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(h[i : i+2])
	}
	return b.String()
}

// coreTask is a task as the reports show it.
func coreTask(t core.Task) output.CoreTask {
	return output.CoreTask{Address: t.Address, PID: t.PID, TGID: t.TGID, Comm: t.Comm, State: t.State, CPU: t.CPU, Active: t.Active}
}

// coreStack is a stack as the reports show it.
func coreStack(st *core.Stack) output.CoreStack {
	out := output.CoreStack{Task: coreTask(st.Task), Stop: st.Stop, UserMode: st.UserMode, Frames: []output.CoreFrame{}}
	for _, f := range st.Frames {
		out.Frames = append(out.Frames, output.CoreFrame{Address: f.AddrHex, Function: f.Function, Offset: f.Offset, Module: f.Module, Exception: f.Exception})
	}
	return out
}
