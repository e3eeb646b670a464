package cli

import (
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kinst/kinst/core"
	"github.com/kinst/kinst/output"
)

// coreFreeBSD runs a `kinst core` request on a FreeBSD minidump: info,
// log and rd read what the dump format holds; the rest need the FreeBSD
// kernel's symbols and types and are refused.
func coreFreeBSD(f *core.FreeBSD, req CoreRequest, w io.Writer) error {
	if req.Options.BTF != "" || req.Options.Vmlinux != "" {
		return fmt.Errorf("--btf and --vmlinux take Linux kernel files; %s is a FreeBSD minidump", req.Dump)
	}
	switch req.Command {
	case "info":
		return CoreFreeBSDInfoReport(f, req.JSON, w)
	case "log":
		return CoreFreeBSDLog(f, req.JSON, w)
	case "rd":
		return CoreFreeBSDRead(f, req.Arg, req.Length, req.Phys, req.JSON, w)
	}
	what := map[string]string{"ps": "listing tasks (ps)", "bt": "unwinding stacks (bt)", "sym": "resolving symbols (sym)", "dis": "disassembling a function (dis)"}[req.Command]
	if what == "" {
		what = strconv.Quote(req.Command)
	}
	return f.Refuse(what)
}

// CoreFreeBSDInfoReport prints what a FreeBSD minidump is: header
// version and kernel address layout, memory, pages, message buffer.
func CoreFreeBSDInfoReport(f *core.FreeBSD, asJSON bool, w io.Writer) error {
	m := f.Dump
	inf := output.CoreFreeBSDInfo{Format: m.Format(), Version: m.Version,
		KernBase: fmt.Sprintf("%#x", m.KernBase), DmapBase: fmt.Sprintf("%#x", m.DmapBase), DmapEnd: fmt.Sprintf("%#x", m.DmapEnd),
		MemoryBytes: f.MemoryBytes(), BitmapPages: m.BitmapPages(), DumpedPages: m.DumpedPages(),
		PmapEntries: m.PmapEntries(), PmapEntry: "pde", MsgbufBytes: len(m.MessageBuffer())}
	if m.Version == 1 {
		inf.PmapEntry = "pte"
	}
	for _, r := range m.DumpAvail() {
		inf.DumpAvail = append(inf.DumpAvail, output.CoreRange{Start: fmt.Sprintf("%#x", r.Start), End: fmt.Sprintf("%#x", r.End)})
	}
	for _, l := range f.MessageBuffer().Lines() {
		if p, ok := strings.CutPrefix(l.Text, "panic: "); ok {
			inf.Panic = p
		}
	}
	if asJSON {
		return writeJSON(w, inf)
	}
	fmt.Fprintf(w, "format:         %s version %d\n", inf.Format, inf.Version)
	fmt.Fprintf(w, "kernbase:       %s (the pmap's first address)\n", inf.KernBase)
	fmt.Fprintf(w, "direct map:     [%s, %s)\n", inf.DmapBase, inf.DmapEnd)
	src := "dump_avail"
	if inf.DumpAvail == nil {
		src = "bitmap span"
	}
	fmt.Fprintf(w, "memory:         %d MiB (%s)\n", inf.MemoryBytes>>20, src)
	for _, r := range inf.DumpAvail {
		fmt.Fprintf(w, "  [%s, %s)\n", r.Start, r.End)
	}
	fmt.Fprintf(w, "pages:          %d dumped of %d in the bitmap (%d MiB)\n", inf.DumpedPages, inf.BitmapPages, inf.DumpedPages*4096>>20)
	size := "4 KiB PTEs"
	if inf.PmapEntry == "pde" {
		size = "2 MiB PDEs"
	}
	fmt.Fprintf(w, "kernel pmap:    %d %s\n", inf.PmapEntries, size)
	fmt.Fprintf(w, "msgbuf:         %d bytes\n", inf.MsgbufBytes)
	if inf.Panic != "" {
		fmt.Fprintf(w, "panic:          %s\n", inf.Panic)
	}
	return nil
}

// CoreFreeBSDLog prints the kernel message buffer, oldest line first, as
// dmesg does ("<N>" priorities taken off).
func CoreFreeBSDLog(f *core.FreeBSD, asJSON bool, w io.Writer) error {
	mb := f.MessageBuffer()
	lines := mb.Lines()
	if asJSON {
		return writeJSON(w, output.CoreFreeBSDMessages{Ordered: mb.Ordered, Size: mb.Size, WriteSeq: mb.WriteSeq, Lines: mapSlice(lines, func(l core.MessageLine) output.CoreMessageLine { return output.CoreMessageLine(l) })})
	}
	if !mb.Ordered {
		fmt.Fprintln(w, "(write position unknown: no struct msgbuf after the buffer; shown from after its last NUL, oldest first only if the ring never wrapped)")
	}
	for _, l := range lines {
		fmt.Fprintln(w, l.Text)
	}
	return nil
}

// CoreFreeBSDRead hex-dumps kernel virtual memory through the
// minidump's pmap and direct map, or physical memory with phys. Only
// numeric addresses: there are no symbols.
func CoreFreeBSDRead(f *core.FreeBSD, at string, n int, phys, asJSON bool, w io.Writer) error {
	if phys {
		return corePhysRead(f.Dump, at, n, asJSON, w)
	}
	if err := rdLength(n); err != nil {
		return err
	}
	a, err := strconv.ParseUint(at, 0, 64)
	if err != nil {
		return fmt.Errorf("rd: %q is not an address (symbol names %w)", at, core.ErrNeedsFreeBSDKernel)
	}
	b, err := f.ReadVirt(a, n)
	if err != nil {
		return err
	}
	return printMemory(w, output.CoreMemory{Address: fmt.Sprintf("%#x", a), Bytes: hex.EncodeToString(b)}, a, b, asJSON)
}
