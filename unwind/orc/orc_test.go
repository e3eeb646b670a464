package orc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

func encodeEntry(e Entry) []byte {
	b := make([]byte, EntrySize)
	binary.LittleEndian.PutUint16(b, uint16(e.SPOffset))
	binary.LittleEndian.PutUint16(b[2:], uint16(e.BPOffset))
	bits := uint16(e.SPReg) | uint16(e.BPReg)<<4 | uint16(e.Type)<<8
	if e.End {
		bits |= 1 << 10
	}
	binary.LittleEndian.PutUint16(b[4:], bits)
	return b
}

// buildTable encodes rows as the kernel's .orc_unwind_ip (relative to
// each slot's own address, at ipBase) and .orc_unwind.
func buildTable(t *testing.T, ipBase uint64, rows []row) *Table {
	t.Helper()
	var ips, ents []byte
	for i, r := range rows {
		ips = binary.LittleEndian.AppendUint32(ips, uint32(int32(int64(r.ip)-int64(ipBase+uint64(4*i)))))
		ents = append(ents, encodeEntry(r.e)...)
	}
	tab, err := Parse(ips, ipBase, ents)
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

type row struct {
	ip uint64
	e  Entry
}

type memory map[uint64]uint64

func (m memory) ReadU64(a uint64) (uint64, error) {
	v, ok := m[a]
	if !ok {
		return 0, fmt.Errorf("unmapped %#x", a)
	}
	return v, nil
}

const (
	k   = 0xffffffff81000000 // kernel text
	stk = 0xffffc90000010000 // a stack
)

func TestDecodeEntry(t *testing.T) {
	for _, e := range []Entry{
		{SPOffset: 8, SPReg: RegSP, Type: TypeCall},
		{SPOffset: -16, BPOffset: -16, SPReg: RegBP, BPReg: RegPrevSP, Type: TypeCall},
		{SPReg: RegUndefined, End: true},
		{SPOffset: 160, SPReg: RegSP, Type: TypeRegs},
		{SPReg: RegR10, Type: TypeRegsPartial, BPReg: RegBP, BPOffset: 8},
	} {
		if got := DecodeEntry(encodeEntry(e)); got != e {
			t.Errorf("DecodeEntry(encode(%+v)) = %+v", e, got)
		}
	}
}

func TestLookup(t *testing.T) {
	// Out of order on purpose, with a terminator duplicate at k+0x100.
	tab := buildTable(t, k+0x100000, []row{
		{k + 0x100, Entry{SPReg: RegUndefined}},
		{k + 0x0, Entry{SPOffset: 8, SPReg: RegSP}},
		{k + 0x100, Entry{SPOffset: 24, SPReg: RegSP}},
		{k + 0x10, Entry{SPOffset: 16, SPReg: RegSP}},
	})
	for _, tc := range []struct {
		ip   uint64
		sp   int16
		find bool
	}{
		{k - 1, 0, false}, {k, 8, true}, {k + 0xf, 8, true}, {k + 0x10, 16, true}, {k + 0x100, 24, true}, {k + 0x5000, 24, true},
	} {
		e, ok := tab.Lookup(tc.ip)
		if ok != tc.find || (ok && e.SPOffset != tc.sp) {
			t.Errorf("Lookup(%#x) = %+v, %v; want sp offset %d, %v", tc.ip, e, ok, tc.sp, tc.find)
		}
	}
	if _, err := Parse(make([]byte, 8), k, make([]byte, 6)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("mismatched tables: %v", err)
	}
}

// The frames of a kernel thread: leaf() called from mid() (frame
// pointer based, as after push %rbp; mov %rsp,%rbp) called from
// thread_fn() whose row ends the stack.
func TestUnwindCalls(t *testing.T) {
	const leaf, mid, top = k + 0x1000, k + 0x2000, k + 0x3000
	tab := buildTable(t, k, []row{
		{leaf, Entry{SPOffset: 16, SPReg: RegSP, Type: TypeCall}}, // one push
		{mid, Entry{SPOffset: 16, SPReg: RegBP, BPReg: RegPrevSP, BPOffset: -16, Type: TypeCall}},
		{top, Entry{SPReg: RegUndefined, End: true}},
		{top + 0x100, Entry{SPReg: RegUndefined}},
	})
	// Stack, growing down: leaf's pushed word and return into mid;
	// mid's saved rbp and return into top.
	sp0 := uint64(stk + 0x100)
	bpMid := uint64(stk + 0x120) // mid's frame pointer: saved rbp at bp, return at bp+8
	mem := memory{
		sp0:       0x1111,       // leaf's push
		sp0 + 8:   mid + 0x20,   // return into mid
		bpMid:     stk + 0x1f00, // top's rbp
		bpMid + 8: top + 0x40,   // return into top
	}
	frames, err := Unwind(tab, mem, State{IP: leaf + 5, SP: sp0, BP: bpMid})
	if err != nil {
		t.Fatal(err)
	}
	want := []Frame{{IP: leaf + 5, SP: sp0}, {IP: mid + 0x20, SP: sp0 + 16}, {IP: top + 0x40, SP: bpMid + 16}}
	if fmt.Sprint(frames) != fmt.Sprint(want) {
		t.Errorf("frames %+v, want %+v", frames, want)
	}
}

// A syscall: the entry code's pt_regs row leads to user mode, which ends
// the kernel stack; an interrupt's pt_regs from kernel mode continues
// at the interrupted instruction.
func TestUnwindRegs(t *testing.T) {
	const fn, entry, irq, interrupted = k + 0x1000, k + 0x2000, k + 0x3000, k + 0x4000
	tab := buildTable(t, k, []row{
		{fn, Entry{SPOffset: 8, SPReg: RegSP, Type: TypeCall}},
		{entry, Entry{SPOffset: 0xf8, SPReg: RegSP, Type: TypeRegs}}, // pt_regs at stk+0x200
		{irq, Entry{SPOffset: 0, SPReg: RegSP, Type: TypeRegsPartial}},
		{interrupted, Entry{SPReg: RegUndefined, End: true}},
	})
	regs := uint64(stk + 0x200)
	mem := memory{
		stk + 0x100:        entry + 0x30, // fn's return into the entry code
		regs + ptIP:        0x401000,     // user RIP
		regs + ptSP:        0x7ffc0000,
		regs + ptCS:        0x33, // user mode
		regs + ptBP:        0,
		stk + 0x300:        interrupted + 3, // iret frame: ip
		stk + 0x300 + 8:    0x10,            // cs: kernel
		stk + 0x300 + 0x18: stk + 0x800,     // sp
	}
	frames, err := Unwind(tab, mem, State{IP: fn + 1, SP: stk + 0x100})
	if err != nil || len(frames) != 2 || frames[1].IP != entry+0x30 {
		t.Errorf("syscall: %+v, %v", frames, err)
	}
	// Starting at the IRQ entry's iret frame (a CPU's registers).
	frames, err = Unwind(tab, mem, State{IP: irq + 1, SP: stk + 0x300, Signal: true})
	if err != nil || len(frames) != 2 || frames[1].IP != interrupted+3 || !frames[1].Signal || frames[1].SP != stk+0x800 {
		t.Errorf("interrupt: %+v, %v", frames, err)
	}
}

// A CPU caught in an interrupt handler on its IRQ stack: the handler's
// caller switched stacks (call_on_irqstack saves sp at the IRQ stack's
// top, and its row reads it back, SP-indirect), so the caller's frame is
// on the task stack, below the IRQ stack in memory. Not a loop.
func TestUnwindIRQStack(t *testing.T) {
	const handler, sysvec, entry = k + 0x1000, k + 0x2000, k + 0x3000
	tab := buildTable(t, k, []row{
		{handler, Entry{SPOffset: 8, SPReg: RegSP, Type: TypeCall}},
		{sysvec, Entry{SPOffset: 16, SPReg: RegSPIndirect, Type: TypeCall}},
		{entry, Entry{SPReg: RegUndefined, End: true}},
	})
	const tos = stk + 0x40000 - 8 // the IRQ stack's top slot
	const taskSP = stk + 0x100    // sysvec's sp on the task stack
	mem := memory{
		tos - 8:    sysvec + 0x20, // the handler's return into sysvec
		tos:        taskSP,        // the saved task-stack sp
		taskSP + 8: entry + 0x16,  // sysvec's return into the entry code
	}
	frames, err := Unwind(tab, mem, State{IP: handler + 1, SP: tos - 8, Signal: true})
	if err != nil {
		t.Fatalf("%+v: %v", frames, err)
	}
	want := []Frame{{IP: handler + 1, SP: tos - 8, Signal: true}, {IP: sysvec + 0x20, SP: tos}, {IP: entry + 0x16, SP: taskSP + 16}}
	if fmt.Sprint(frames) != fmt.Sprint(want) {
		t.Errorf("frames %+v, want %+v", frames, want)
	}
}

func TestUnwindStops(t *testing.T) {
	const fn = k + 0x1000
	tab := buildTable(t, k, []row{
		{fn, Entry{SPOffset: 8, SPReg: RegSP, Type: TypeCall}},
		{fn + 0x100, Entry{SPReg: RegR13, Type: TypeCall}},
		{fn + 0x200, Entry{SPReg: RegUndefined}},
		{fn + 0x300, Entry{SPOffset: 0, SPReg: RegSP, Type: TypeCall}},
		{fn + 0x400, Entry{SPOffset: 0, SPReg: RegSP, Type: TypeRegs}},
	})
	for _, tc := range []struct {
		name string
		st   State
		mem  memory
		want error
	}{
		{"no entry", State{IP: k + 1, SP: stk}, memory{}, ErrNoEntry},
		{"unreadable", State{IP: fn + 1, SP: stk}, memory{}, ErrRead},
		{"loop", State{IP: fn + 0x301, SP: stk}, memory{stk - 8: fn + 0x301}, ErrLoop},
		{"unknown register", State{IP: fn + 0x101, SP: stk}, memory{}, ErrBadEntry},
		{"undefined without end", State{IP: fn + 0x201, SP: stk}, memory{}, ErrBadEntry},
		// A return address of 0 or into user space is a corrupt stack,
		// not the end of one.
		{"return to nowhere", State{IP: fn + 1, SP: stk}, memory{stk: 0}, ErrNotKernel},
		{"return to user space", State{IP: fn + 1, SP: stk}, memory{stk: 0x401000}, ErrNotKernel},
		// pt_regs from kernel mode that lead back to the same frame.
		{"repeated frame", State{IP: fn + 0x401, SP: stk + 0x100, Signal: true},
			memory{stk + 0x100 + ptIP: fn + 0x401, stk + 0x100 + ptSP: stk + 0x100, stk + 0x100 + ptCS: 0x10, stk + 0x100 + ptBP: 0}, ErrLoop},
	} {
		_, err := Unwind(tab, tc.mem, tc.st)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	// R13 known from the CPU's registers at the start.
	frames, err := Unwind(tab, memory{stk + 0x500 - 8: fn + 1}, State{IP: fn + 0x101, SP: stk, Signal: true, Regs: &Regs{R13: stk + 0x500}})
	if len(frames) < 2 || frames[1].IP != fn+1 {
		t.Errorf("R13-based frame: %+v, %v", frames, err)
	}
}

func TestUnwindUserMode(t *testing.T) {
	tab := buildTable(t, k, []row{{k, Entry{SPOffset: 8, SPReg: RegSP}}})
	frames, err := Unwind(tab, memory{}, State{IP: 0x401000, SP: 0x7ffc0000, Signal: true})
	if len(frames) != 0 || !errors.Is(err, ErrUserMode) {
		t.Errorf("user-mode start: %v, %v", frames, err)
	}
}

// TestLookupSorted: a sorted table is searched in its encoded form, with
// the same answers as the decoded one.
func TestLookupSorted(t *testing.T) {
	rows := []row{{k, Entry{SPOffset: 8, SPReg: RegSP}}, {k + 0x10, Entry{SPReg: RegUndefined}}, {k + 0x10, Entry{SPOffset: 16, SPReg: RegSP}}, {k + 0x20, Entry{SPOffset: 24, SPReg: RegSP}}}
	tab := buildTable(t, k+0x1000, rows)
	if tab.ips != nil {
		t.Fatal("a sorted table was decoded")
	}
	for _, tc := range []struct {
		ip uint64
		sp int16
	}{{k, 8}, {k + 0xf, 8}, {k + 0x10, 16}, {k + 0x1f, 16}, {k + 0x20, 24}} {
		if e, ok := tab.Lookup(tc.ip); !ok || e.SPOffset != tc.sp {
			t.Errorf("Lookup(%#x) = %+v, %v; want sp offset %d", tc.ip, e, ok, tc.sp)
		}
	}
	if lo, hi := tab.Range(); lo != k || hi != k+0x20 {
		t.Errorf("Range = %#x-%#x", lo, hi)
	}
}

// The two layouts of an entry's last 16 bits, built as the kernel's
// bitfields lay them out (little-endian, first member lowest).
func TestDecodeEntryFormats(t *testing.T) {
	entry := func(spReg, bpReg, rest uint16) []byte {
		b := []byte{0x10, 0x00, 0xf0, 0xff, 0, 0} // sp_offset 16, bp_offset -16
		binary.LittleEndian.PutUint16(b[4:], spReg|bpReg<<4|rest<<8)
		return b
	}
	for _, c := range []struct {
		name string
		b    []byte
		f    Format
		want Entry
	}{
		{"4.14 call", entry(RegSP, RegPrevSP, 0), Format414, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegSP, BPReg: RegPrevSP, Type: TypeCall}},
		{"4.14 regs", entry(RegSP, 0, 1), Format414, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegSP, Type: TypeRegs}},
		{"4.14 end", entry(RegUndefined, 0, 1<<2), Format414, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegUndefined, End: true}},
		{"6.4 undefined", entry(RegSP, 0, 0), Format64, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegUndefined}},
		{"6.4 end of stack", entry(RegUndefined, 0, 1), Format64, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegUndefined, End: true}},
		{"6.4 call", entry(RegBP, RegPrevSP, 2), Format64, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegBP, BPReg: RegPrevSP, Type: TypeCall}},
		{"6.4 regs, signal", entry(RegSP, 0, 3|1<<3), Format64, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegSP, Type: TypeRegs}},
		{"6.4 regs partial", entry(RegSP, 0, 4), Format64, Entry{SPOffset: 16, BPOffset: -16, SPReg: RegSP, Type: TypeRegsPartial}},
	} {
		if got := DecodeEntryFormat(c.b, c.f); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	for rel, want := range map[string]Format{"6.1.0-56-amd64": Format414, "6.3.0": Format414, "6.4.0": Format64, "6.12.117+deb12-amd64": Format64, "7.0": Format64, "4.19.0": Format414, "junk": Format414} {
		if got := FormatOf(rel); got != want {
			t.Errorf("FormatOf(%q) = %v, want %v", rel, got, want)
		}
	}
}
