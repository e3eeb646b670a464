package cli

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kinst/kinst/internal/elfsym"
	"github.com/kinst/kinst/output"
	"github.com/kinst/kinst/process"
	"github.com/kinst/kinst/unwind"
)

// SymbolOptions choose how symbols are named.
type SymbolOptions struct {
	// NoDemangle keeps C++ and Rust names as the symbol tables spell
	// them (see unwind.Demangle).
	NoDemangle bool
}

func (o SymbolOptions) name(n string) string {
	if o.NoDemangle {
		return n
	}
	return unwind.Demangle(n)
}

func symbolOptions(opts []SymbolOptions) SymbolOptions {
	if len(opts) > 0 {
		return opts[0]
	}
	return SymbolOptions{}
}

// ShowUnwindTable compiles the CFI of the ELF file at path and prints its
// rows; with pc != nil, only the row in effect at *pc.
func ShowUnwindTable(path string, pc *uint64, asJSON bool, w io.Writer, opts ...SymbolOptions) error {
	so := symbolOptions(opts)
	t0 := time.Now()
	tab, err := unwind.Open(path)
	if err != nil {
		return err
	}
	took := time.Since(t0)
	syms, _ := elfsym.Open(path) // symbols are optional
	rep := output.UnwindTable{File: path, Sections: tab.Sections, FDEs: tab.FDEs, SkippedFDEs: tab.Skipped,
		BytesPerRow: unwind.RowBytes, TableBytes: tab.Bytes(), CompileNs: took.Nanoseconds(), Rows: []output.UnwindRow{}}
	if syms != nil {
		rep.BuildID = syms.BuildID()
	}
	// Through the cache's view of the file: a stripped file's internal
	// functions named by its debug file, a Go binary's by .gopclntab.
	lookup := func(pc uint64) (elfsym.Symbol, uint64, bool) {
		if syms != nil {
			return syms.Lookup(pc)
		}
		return elfsym.Symbol{}, 0, false
	}
	if f, err := unwind.NewCache().Open(path); err == nil {
		lookup = func(pc uint64) (elfsym.Symbol, uint64, bool) { return f.LookupSymbol(path, pc) }
	}
	addRow := func(r unwind.Row) {
		j := output.UnwindRow{PC: fmt.Sprintf("%#x", r.PC), CFA: r.CFA.String(), RBP: r.RBP.String(), RA: r.RA.String()}
		switch r.CFA.Kind {
		case unwind.CFAPLT:
			j.CFAExpr = "plt"
		case unwind.CFADeref:
			j.CFAExpr = "deref"
		case unwind.CFAExpression:
			j.CFAExpr = "unsupported"
		}
		if r.CFA.Kind != unwind.CFANone {
			if s, off, ok := lookup(r.PC); ok {
				j.Symbol = so.name(s.Name)
				if off != 0 {
					j.Symbol += fmt.Sprintf("+%#x", off)
				}
			}
		}
		rep.Rows = append(rep.Rows, j)
	}
	if pc != nil {
		r, err := tab.Lookup(*pc)
		if err != nil {
			return err
		}
		addRow(r)
	} else {
		for i := 0; i < tab.Len(); i++ {
			addRow(tab.Row(i))
		}
	}
	if asJSON {
		return writeJSON(w, rep)
	}
	bw := bufio.NewWriter(w)
	defer bw.Flush()
	fmt.Fprintf(bw, "%s: %s, %d FDEs, %d rows × %d bytes, %d bytes with the FDE starts, compiled in %v\n",
		path, strings.Join(tab.Sections, " "), tab.FDEs, tab.Len(), unwind.RowBytes, tab.Bytes(), took.Round(10*time.Microsecond))
	if tab.Skipped > 0 {
		fmt.Fprintf(bw, "%d FDEs skipped (instructions that could not be interpreted)\n", tab.Skipped)
	}
	fmt.Fprintf(bw, "%-18s %-9s %-9s %-9s %s\n", "PC", "CFA", "RBP", "RA", "")
	for _, r := range rep.Rows {
		note := r.Symbol
		if r.CFAExpr != "" {
			note = strings.TrimSpace(note + " [" + r.CFAExpr + "]")
		}
		fmt.Fprintf(bw, "%-18s %-9s %-9s %-9s %s\n", r.PC, r.CFA, r.RBP, r.RA, note)
	}
	return nil
}

// ShowUnwindStack unwinds the user stacks of pid's threads (or one
// thread) without frame pointers where CFI is available. Without
// usePtrace only blocked threads unwind, from the registers in
// /proc/PID/task/TID/syscall; with it every thread is stopped for a
// moment to read its registers.
func ShowUnwindStack(pid, tid int, usePtrace, asJSON bool, w io.Writer, opts ...SymbolOptions) error {
	so := symbolOptions(opts)
	p, err := unwind.NewCache().Process(pid)
	if err != nil {
		return err
	}
	tids, err := threads(pid)
	if err != nil {
		return err
	}
	if tid != 0 {
		if !slices.Contains(tids, tid) {
			return fmt.Errorf("process %d has no thread %d (its threads: %s)", pid, tid, listInts(tids, 8))
		}
		tids = []int{tid}
	}
	var out []output.UnwindThread
	for _, t := range tids {
		th := output.UnwindThread{TID: t, Comm: comm(pid, t), Frames: []output.UnwindFrame{}}
		if kernelThread(pid, t) {
			// No user stack, and /proc/…/syscall shows zeros: its kernel
			// stack instead.
			th.KernelThread = true
			if th.KernelStack, err = kernelStack(pid, t); err != nil {
				th.Error = "kernel stack: " + err.Error()
			}
			out = append(out, th)
			continue
		}
		regs, nr, err := unwind.SyscallRegs(pid, t)
		if err == nil && nr >= 0 {
			th.Syscall = &nr
		}
		if usePtrace {
			pregs, perr := unwind.PtraceRegs(t)
			switch {
			case perr == nil:
				regs, err = pregs, nil
			case err == nil:
				// Refused (another tracer holds it), but blocked: its
				// registers in /proc unwind it all the same.
				th.Note = fmt.Sprintf("not stopped: %v%s; unwound from its registers in /proc/PID/task/TID/syscall, as it is not running", perr, process.TracedBy(t))
			default:
				err = fmt.Errorf("%w%s", perr, process.TracedBy(t))
			}
		}
		if err != nil {
			th.Error = err.Error()
			if errors.Is(err, unwind.ErrNotBlocked) {
				th.Error += " (--ptrace stops it for a moment to read its registers)"
			}
			out = append(out, th)
			continue
		}
		th.Frames = userFrames(p, regs, so)
		out = append(out, th)
	}
	notes := p.DebugNotes()
	if asJSON {
		return writeJSON(w, output.UnwindStacks{PID: pid, Threads: out, DebugNotes: notes})
	}
	for name, err := range p.Missing {
		fmt.Fprintf(w, "warning: %s: %v\n", name, err)
	}
	for name, note := range notes {
		fmt.Fprintf(w, "note: %s: %s\n", name, note)
	}
	for _, th := range out {
		printUnwindThread(w, th)
	}
	return nil
}

// userFrames unwinds a thread's user stack from regs, each frame named.
func userFrames(p *unwind.Process, regs unwind.Regs, so SymbolOptions) []output.UnwindFrame {
	frames := []output.UnwindFrame{}
	p.Mem.Reset()
	pcs, methods := unwind.StackMethods(regs, p.Mem, p, 0)
	for i, pc := range pcs {
		f := output.UnwindFrame{PC: fmt.Sprintf("%#x", pc)}
		// A return address may be the first byte after a call to a
		// function that never returns: name the call's last byte.
		at := pc
		if i > 0 {
			at--
		}
		if s, ok := p.Symbolize(at); ok {
			f.File, f.Symbol, f.Offset = s.File, so.name(s.Name), fmt.Sprintf("%#x", s.Offset+(pc-at))
		}
		if l, ok := p.SourceLine(at); ok {
			f.Source = l.String()
		}
		if i > 0 {
			f.Method = methods[i-1].String()
		}
		frames = append(frames, f)
	}
	return frames
}

// printUnwindThread is one thread of `kinst unwind stack` as text.
func printUnwindThread(w io.Writer, th output.UnwindThread) {
	fmt.Fprintf(w, "thread %d (%s)", th.TID, th.Comm)
	if th.KernelThread {
		fmt.Fprint(w, ": a kernel thread, no user stack")
		if th.Error != "" {
			fmt.Fprintf(w, " (%s)\n", th.Error)
			return
		}
		fmt.Fprintln(w, "; its kernel stack:")
		for i, f := range th.KernelStack {
			fmt.Fprintf(w, "  #%-2d %s\n", i, f)
		}
		return
	}
	if th.Syscall != nil {
		fmt.Fprintf(w, " in system call %d", *th.Syscall)
	}
	if th.Error != "" {
		fmt.Fprintf(w, ": %s\n", th.Error)
		return
	}
	if th.Note != "" {
		fmt.Fprintf(w, " (%s)", th.Note)
	}
	fmt.Fprintln(w)
	for i, f := range th.Frames {
		where := f.File
		if f.Symbol != "" {
			where = f.Symbol
		}
		src := ""
		if f.Source != "" {
			src = " at " + f.Source
		}
		fmt.Fprintf(w, "  #%-2d %-18s %s+%s %s%s\n", i, f.PC, where, f.Offset, f.Method, src)
	}
}

// listInts is up to n of xs, with how many more.
func listInts(xs []int, n int) string {
	var b strings.Builder
	for i, x := range xs[:min(n, len(xs))] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(x))
	}
	if len(xs) > n {
		fmt.Fprintf(&b, " and %d more", len(xs)-n)
	}
	return b.String()
}

func threads(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var tids []int
	for _, e := range ents {
		if t, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, t)
		}
	}
	if len(tids) == 0 {
		return nil, errors.New("no threads")
	}
	return tids, nil
}

// pfKthread is PF_KTHREAD in the flags field of stat (include/linux/sched.h).
const pfKthread = 0x00200000

// kernelThread reports whether a thread is a kernel thread: PF_KTHREAD in
// the flags of /proc/PID/task/TID/stat.
func kernelThread(pid, tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
	if err != nil {
		return false
	}
	// "tid (comm) S ppid pgrp session tty_nr tpgid flags …": comm may hold
	// spaces and parentheses, so the fields start after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 7 {
		return false
	}
	flags, err := strconv.ParseUint(f[6], 10, 64)
	return err == nil && flags&pfKthread != 0
}

// kernelStack reads /proc/PID/task/TID/stack ("[<0>] func+0x1/0x2 [mod]"
// lines, innermost first) without the "[<…>]" prefixes.
func kernelStack(pid, tid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stack", pid, tid))
	if err != nil {
		return nil, err
	}
	var frames []string
	for _, line := range strings.Split(string(b), "\n") {
		if i := strings.IndexByte(line, ']'); i >= 0 && strings.HasPrefix(line, "[<") {
			line = line[i+1:]
		}
		if line = strings.TrimSpace(line); line != "" {
			frames = append(frames, line)
		}
	}
	return frames, nil
}

func comm(pid, tid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", pid, tid))
	return strings.TrimSpace(string(b))
}
