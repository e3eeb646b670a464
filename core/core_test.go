package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/core/dump/dumptest"
	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/internal/dumpgen"
	"github.com/kinst/kinst/unwind/orc"
)

// The x86-64 kernel's fixed mapping and page size, as the tests lay out
// memory.
const (
	startKernelMap = 0xffffffff80000000
	pageSize       = 4096
	pageMask       = pageSize - 1
)

func TestStateLetter(t *testing.T) {
	for _, tc := range []struct {
		state, exit uint32
		want        string
	}{
		{0, 0, "R"}, {1, 0, "S"}, {2, 0, "D"}, {4, 0, "T"}, {8, 0, "t"}, {0, 0x10, "X"}, {0, 0x20, "Z"},
		{0x40, 0, "P"}, {0x402, 0, "I"}, {0x81, 0, "S"}, // TASK_WAKEKILL|INTERRUPTIBLE reports S
		{0x8000, 0, "D"},          // TASK_FROZEN: the freezer's tasks report D
		{0x8000 | 0x2001, 0, "D"}, // frozen with TASK_FREEZABLE|INTERRUPTIBLE left over
		{0x1000, 0, "D"},          // TASK_RTLOCK_WAIT reports as an rt_mutex sleep
		{0x502, 0, "I"},           // TASK_IDLE with TASK_WAKEKILL: masked, still I
		{0x402, 0x20, "I"},        // TASK_IDLE wins over exit_state
		{0x100, 0, "R"},           // TASK_WAKEKILL alone is outside TASK_REPORT
		{0x80, 0x10, "X"},         // TASK_DEAD with EXIT_DEAD
		{0x80, 0x20, "Z"},         // TASK_DEAD with EXIT_ZOMBIE
	} {
		if got := stateLetter(tc.state, tc.exit); got != tc.want {
			t.Errorf("stateLetter(%#x, %#x) = %s, want %s", tc.state, tc.exit, got, tc.want)
		}
	}
}

func TestBlockData(t *testing.T) {
	ring := make([]byte, 64)
	copy(ring[8:], "hello")   // block at lpos 0: id, then text
	copy(ring[0x28:], "wrap") // a record that wrapped to the start: begin in the last wrap
	copy(ring[8:], "hello")
	for _, tc := range []struct {
		begin, next uint64
		want        string
		ok          bool
	}{
		{0, 16, "hello\x00\x00\x00", true},
		{64 + 0x20, 64 + 0x30, "wrap\x00\x00\x00\x00", true},
		{56, 64 + 16, "hello\x00\x00\x00", true}, // wraps: data from the ring's start
		{1, 1, "", false},                        // data-less
		{0, 200, "", false},                      // spans wraps
	} {
		b, ok := blockData(ring, 6, tc.begin, tc.next)
		if ok != tc.ok || (ok && string(b) != tc.want) {
			t.Errorf("blockData(%d, %d) = %q, %v; want %q, %v", tc.begin, tc.next, b, ok, tc.want, tc.ok)
		}
	}
	if got := PanicMessage([]LogRecord{{Text: "x"}, {Text: "Kernel panic - not syncing: sysrq triggered crash\n"}, {Text: "y"}}); got != "sysrq triggered crash" {
		t.Errorf("PanicMessage = %q", got)
	}
}

func TestWalkList(t *testing.T) {
	d := dumptest.New()
	const root = 0x100000
	d.Write(root, make([]byte, pageSize))
	d.Info = fmt.Sprintf("OSRELEASE=test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", uint64(startKernelMap+0x200000), root-0x200000)
	k, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// head → a → b → head, in the image mapping (physical = va - map + phys_base).
	va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
	pa := func(off uint64) uint64 { return root + off }
	d.Put64(pa(0x100), va(0x200))
	d.Put64(pa(0x200), va(0x300))
	d.Put64(pa(0x300), va(0x100))
	var got []uint64
	if err := k.walkList(va(0x100), 8, func(e uint64) error { got = append(got, e); return nil }); err != nil || len(got) != 2 || got[0] != va(0x1f8) || got[1] != va(0x2f8) {
		t.Errorf("walk: %#x, %v", got, err)
	}
	d.Put64(pa(0x300), va(0x200)) // b → a: a loop that skips head
	if err := k.walkList(va(0x100), 8, func(uint64) error { return nil }); err == nil || !strings.Contains(err.Error(), "loops") {
		t.Errorf("looping list: %v", err)
	}
	d.Put64(pa(0x300), 0xffffc90000000000) // into unmapped memory
	if err := k.walkList(va(0x100), 8, func(uint64) error { return nil }); !errors.Is(err, dump.ErrNotPresent) {
		t.Errorf("list into unmapped memory: %v", err)
	}
}

// FuzzLog: whatever VMCOREINFO and ring memory say, reading the log ends
// with records or an error, never a panic or a runaway allocation.
func FuzzLog(f *testing.F) {
	layout := "OFFSET(printk_ringbuffer.desc_ring)=0\nOFFSET(printk_ringbuffer.text_data_ring)=48\n" +
		"OFFSET(prb_desc_ring.count_bits)=0\nOFFSET(prb_desc_ring.descs)=8\nOFFSET(prb_desc_ring.infos)=16\n" +
		"OFFSET(prb_desc_ring.head_id)=24\nOFFSET(prb_desc_ring.tail_id)=32\nOFFSET(prb_desc.state_var)=0\n" +
		"OFFSET(prb_desc.text_blk_lpos)=8\nOFFSET(prb_data_blk_lpos.begin)=0\nOFFSET(prb_data_blk_lpos.next)=8\n" +
		"OFFSET(prb_data_ring.size_bits)=0\nOFFSET(prb_data_ring.data)=8\nOFFSET(printk_info.seq)=0\n" +
		"OFFSET(printk_info.ts_nsec)=8\nOFFSET(printk_info.text_len)=16\nSIZE(prb_desc)=24\nSIZE(printk_info)=88\n"
	f.Add(layout, []byte{})
	f.Add(layout+"SIZE(prb_desc)=8\n", []byte{4, 0, 0, 0})
	f.Fuzz(func(t *testing.T, info string, mem []byte) {
		d := dumptest.New()
		const root = 0x100000
		d.Write(root, make([]byte, 4*pageSize))
		d.Write(root, mem[:min(len(mem), 4*pageSize)])
		// prb (at image offset 0x200000) points to the ring at +0x100.
		d.Put64(root, startKernelMap+0x200100)
		d.Info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\nSYMBOL(prb)=%x\n",
			uint64(startKernelMap+0x200000), root-0x200000, uint64(startKernelMap+0x200000)) + info
		k, err := New(d, Options{})
		if err != nil {
			return
		}
		k.Log()
	})
}

// testModuleBTF describes struct module as 6.1 lays it out in spirit
// (core_layout, arch's ORC table, kallsyms) with offsets of its own, and
// writes it where Options.BTF can read it.
func testModuleBTF(t *testing.T) string {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	char := &btf.Int{Name: "char", Size: 1, Encoding: btf.Char}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	m := func(name string, typ btf.Type, off uint32) btf.Member {
		return btf.Member{Name: name, Type: typ, Offset: btf.Bits(off * 8)}
	}
	list := &btf.Struct{Name: "list_head", Size: 16, Members: []btf.Member{m("next", ptr, 0), m("prev", ptr, 8)}}
	state := &btf.Enum{Name: "module_state", Size: 4, Values: []btf.EnumValue{{Name: "MODULE_STATE_LIVE", Value: 0}, {Name: "MODULE_STATE_UNFORMED", Value: 3}}}
	layout := &btf.Struct{Name: "module_layout", Size: 16, Members: []btf.Member{m("base", ptr, 0), m("size", u32, 8), m("text_size", u32, 12)}}
	arch := &btf.Struct{Name: "mod_arch_specific", Size: 24, Members: []btf.Member{m("num_orcs", u32, 0), m("orc_unwind_ip", ptr, 8), m("orc_unwind", ptr, 16)}}
	mod := &btf.Struct{Name: "module", Size: 200, Members: []btf.Member{
		m("state", state, 0), m("list", list, 8), m("name", &btf.Array{Index: u32, Type: char, Nelems: 56}, 24),
		m("core_layout", layout, 96), m("arch", arch, 120), m("kallsyms", ptr, 160)}}
	ks := &btf.Struct{Name: "mod_kallsyms", Size: 32, Members: []btf.Member{m("symtab", ptr, 0), m("num_symtab", u32, 8), m("strtab", ptr, 16), m("typetab", ptr, 24)}}
	return btftest.File(t, "vmlinux.btf", list, state, mod, ks)
}

// TestBacktraceThroughModule: a switched-out task whose stack runs from a
// kernel function through a module's function (found by the kernel
// view's module walk: the module's own ORC table and symbols) to a
// kernel thread's outermost frame.
func TestBacktraceThroughModule(t *testing.T) {
	d := dumptest.New()
	const root = 0x100000
	d.Write(root, make([]byte, 4*pageSize))
	// The image mapping: physical = va - startKernelMap - 0x200000 + root.
	va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
	put := func(a uint64, b []byte) { d.Write(a-startKernelMap-0x200000+root, b) }
	put64 := func(a, v uint64) { put(a, binary.LittleEndian.AppendUint64(nil, v)) }
	put32 := func(a uint64, v uint32) { put(a, binary.LittleEndian.AppendUint32(nil, v)) }
	const (
		kSched  = startKernelMap + 0x1000000
		kThread = startKernelMap + 0x1000100
		modBase = 0xffffffffc0100000
		modWait = modBase + 0x40
	)
	modules, modStruct, kallsymsAt := va(0x100), va(0x1000), va(0x2000)
	tables := dumpgen.Kallsyms([]dumpgen.KallsymsSymbol{
		{Addr: va(0), Type: 'T', Name: "_text"}, {Addr: modules, Type: 'd', Name: "modules"},
		{Addr: kSched, Type: 't', Name: "kfn_sched"}, {Addr: kThread, Type: 'T', Name: "kthread"},
	}, va(0), kallsymsAt, put)
	d.Info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", va(0), root-0x200000) + tables
	k, err := New(d, Options{BTF: testModuleBTF(t)})
	if err != nil {
		t.Fatal(err)
	}
	// modules → the module's list → modules.
	put64(modules, modStruct+8)
	put64(modStruct+8, modules)
	put(modStruct+24, []byte("mod\x00"))
	put64(modStruct+96, modBase)
	put32(modStruct+104, 0x1000)
	put32(modStruct+108, 0x800)
	// ORC ips are 32-bit offsets from where each is stored.
	rel := func(ip, at uint64) uint32 { return uint32(int32(int64(ip - at))) }
	// Its ORC table: one entry at mod_wait.
	orcIP, orcEnt := va(0x3000), va(0x3100)
	put32(modStruct+120, 1)
	put64(modStruct+128, orcIP)
	put64(modStruct+136, orcEnt)
	put32(orcIP, rel(modWait, orcIP))
	put(orcEnt, orcEntry(orc.Entry{SPOffset: 8, SPReg: orc.RegSP}))
	// Its kallsyms: symbol 0 is the ELF null symbol, 1 is mod_wait.
	ks, symtab, strtab, typetab := va(0x4000), va(0x4100), va(0x4200), va(0x4300)
	put64(modStruct+160, ks)
	put64(ks, symtab)
	put32(ks+8, 2)
	put64(ks+16, strtab)
	put64(ks+24, typetab)
	sym := make([]byte, 48)
	binary.LittleEndian.PutUint32(sym[24:], 1)         // st_name
	binary.LittleEndian.PutUint16(sym[24+6:], 1)       // st_shndx
	binary.LittleEndian.PutUint64(sym[24+8:], modWait) // st_value
	put(symtab, sym)
	put(strtab, []byte("\x00mod_wait\x00"))
	put(typetab, []byte("?t"))

	// The kernel's table claims to sit at 0x1000; entries are relative to it.
	kernelORC, err := orc.Parse(
		binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, rel(kSched, 0x1000)), rel(kThread, 0x1004)),
		0x1000, append(orcEntry(orc.Entry{SPOffset: 16, SPReg: orc.RegSP}), orcEntry(orc.Entry{End: true})...))
	if err != nil {
		t.Fatal(err)
	}
	k.orc.get("ORC", func() (*orcTables, error) { return &orcTables{kernel: kernelORC}, nil })
	// The stack, in the image mapping: the switch frame, then kfn_sched's
	// pushed word and return into mod_wait, then the return into kthread.
	stack := va(0x800)
	put64(stack+5*8, 0)           // bp
	put64(stack+6*8, kSched+5)    // ret_addr: where the task will resume
	put64(stack+56+8, modWait+3)  // return into the module
	put64(stack+56+16, kThread+7) // return into kthread
	st, err := k.Backtrace(Task{PID: 7, Comm: "worker", threadSP: stack})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range st.Frames {
		got = append(got, fmt.Sprintf("%s+%#x[%s]", f.Function, f.Offset, f.Module))
	}
	if want := "kfn_sched+0x5[] mod_wait+0x3[mod] kthread+0x7[]"; strings.Join(got, " ") != want || st.Stop != "" {
		t.Errorf("frames %v (stop %q), want %s", got, st.Stop, want)
	}
	if s, err := k.LookupSymbol("mod:mod_wait"); err != nil || s.Addr != modWait {
		t.Errorf("LookupSymbol(mod:mod_wait) = %+v, %v", s, err)
	}
	if s, off, ok := k.SymbolAt(modWait + 9); !ok || s.Name != "mod_wait" || off != 9 || k.SymbolSize(s) != 0x800-0x40 {
		t.Errorf("SymbolAt(mod_wait+9) = %+v %#x %v", s, off, ok)
	}
}

// orcEntry encodes one 6-byte ORC entry.
func orcEntry(e orc.Entry) []byte {
	bits := uint16(e.SPReg) | uint16(e.BPReg)<<4 | uint16(e.Type)<<8
	if e.End {
		bits |= 1 << 10
	}
	le := binary.LittleEndian
	return le.AppendUint16(le.AppendUint16(le.AppendUint16(nil, uint16(e.SPOffset)), uint16(e.BPOffset)), bits)
}

// TestBacktraceStops: a switched-out task's walk ends cleanly at the
// outermost frame or says why it stopped; a corrupt saved stack is never
// taken for user mode, and a task with no frames has an empty list.
func TestBacktraceStops(t *testing.T) {
	d := dumptest.New()
	const root = 0x100000
	d.Write(root, make([]byte, 4*pageSize))
	va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
	put64 := func(a, v uint64) { d.Put64(a-startKernelMap-0x200000+root, v) }
	const (
		kSched  = startKernelMap + 0x1000000
		kThread = startKernelMap + 0x1000100
		etext   = startKernelMap + 0x1000200
		kInit   = startKernelMap + 0x2000000 // start_kernel, in the init text
		einit   = startKernelMap + 0x2000100
	)
	modules := va(0x100)
	tables := dumpgen.Kallsyms([]dumpgen.KallsymsSymbol{
		{Addr: va(0), Type: 'T', Name: "_text"}, {Addr: modules, Type: 'd', Name: "modules"},
		{Addr: kSched, Type: 't', Name: "kfn_sched"}, {Addr: kThread, Type: 'T', Name: "kthread"},
		{Addr: etext, Type: 'T', Name: "_etext"},
		{Addr: kInit, Type: 'T', Name: "_sinittext"}, {Addr: kInit, Type: 'T', Name: "start_kernel"}, {Addr: einit, Type: 'T', Name: "_einittext"},
	}, va(0), va(0x2000), func(a uint64, b []byte) { d.Write(a-startKernelMap-0x200000+root, b) })
	d.Info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", va(0), root-0x200000) + tables
	k, err := New(d, Options{BTF: testModuleBTF(t)})
	if err != nil {
		t.Fatal(err)
	}
	put64(modules, modules) // no modules
	rel := func(ip, at uint64) uint32 { return uint32(int32(int64(ip - at))) }
	kernelORC, err := orc.Parse(
		binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil,
			rel(kSched, 0x1000)), rel(kThread, 0x1004)), rel(kInit, 0x1008)),
		0x1000, append(append(orcEntry(orc.Entry{SPOffset: 16, SPReg: orc.RegSP}), orcEntry(orc.Entry{End: true})...), orcEntry(orc.Entry{End: true})...))
	if err != nil {
		t.Fatal(err)
	}
	k.orc.get("ORC", func() (*orcTables, error) { return &orcTables{kernel: kernelORC}, nil })
	stack := va(0x800)
	for _, tc := range []struct {
		name        string
		ret, caller uint64 // the switch frame's ret_addr; kfn_sched's return address
		sp          uint64
		frames      int
		stop        string // a substring of Stop; "" for none
	}{
		{name: "clean", ret: kSched + 5, caller: kThread + 7, sp: stack, frames: 2},
		{name: "corrupt switch frame", ret: 0x4141414141, sp: stack, stop: "switch frame at 0xffffffff80200800 is corrupt"},
		{name: "return to nowhere", ret: kSched + 5, caller: 0, sp: stack, frames: 1, stop: "outside the kernel"},
		{name: "return past the text", ret: kSched + 5, caller: etext + 0x40, sp: stack, frames: 2, stop: "no ORC entry"},
		{name: "return into the init text", ret: kSched + 5, caller: kInit + 9, sp: stack, frames: 2},
		{name: "return past the init text", ret: kSched + 5, caller: einit + 9, sp: stack, frames: 2, stop: "no ORC entry"},
		{name: "unreadable switch frame", sp: 0xffffc90000000000, stop: "switch frame at 0xffffc90000000000: virtual address 0xffffc90000000000 is not mapped"},
		{name: "no saved stack pointer", sp: 0, stop: "no saved stack pointer"},
	} {
		put64(stack+5*8, 0)
		put64(stack+6*8, tc.ret)
		put64(stack+56+8, tc.caller)
		st, err := k.Backtrace(Task{PID: 7, Comm: "worker", threadSP: tc.sp})
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if st.Frames == nil || len(st.Frames) != tc.frames || st.UserMode ||
			(tc.stop == "") != (st.Stop == "") || !strings.Contains(st.Stop, tc.stop) ||
			strings.Count(st.Stop, "not mapped") > 1 || strings.Contains(st.Stop, "\n") {
			t.Errorf("%s: %d frames (nil %v), user mode %v, stop %q; want %d frames, stop %q",
				tc.name, len(st.Frames), st.Frames == nil, st.UserMode, st.Stop, tc.frames, tc.stop)
		}
	}
	// Tasks whose task_struct.stack says there is nothing to walk.
	for _, tc := range []struct {
		name string
		task Task
		stop string
	}{
		{"zombie", Task{PID: 8, Comm: "defunct", State: "Z", hasStack: true, threadSP: stack}, "exited"},
		{"sp outside the stack", Task{PID: 8, Comm: "odd", hasStack: true, stack: va(0x4000), threadSP: stack}, "outside the task's stack"},
	} {
		st, err := k.Backtrace(tc.task)
		if err != nil || st.Frames == nil || len(st.Frames) != 0 || !strings.Contains(st.Stop, tc.stop) || strings.Contains(st.Stop, "not mapped") {
			t.Errorf("%s: %+v, %v; want no frames, stop %q", tc.name, st, err, tc.stop)
		}
	}
}

// TestTaskAt: bt ADDR takes a task on the lists, or an address on none
// whose task_struct is self-consistent, and refuses anything else.
func TestTaskAt(t *testing.T) {
	d := dumptest.New()
	const root = 0x100000
	d.Write(root, make([]byte, 20*pageSize))
	va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
	pa := func(a uint64) uint64 { return a - startKernelMap - 0x200000 + root }
	put64 := func(a, v uint64) { d.Put64(pa(a), v) }
	put32 := func(a uint64, v uint32) { d.Write(pa(a), binary.LittleEndian.AppendUint32(nil, v)) }
	initTask, leader, created, garbage := va(0x4000), va(0x5000), va(0x6000), va(0x7000)
	tables := dumpgen.Kallsyms([]dumpgen.KallsymsSymbol{
		{Addr: va(0), Type: 'T', Name: "_text"}, {Addr: initTask, Type: 'D', Name: "init_task"},
	}, va(0), va(0x2000), func(a uint64, b []byte) { d.Write(pa(a), b) })
	d.Info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", va(0), root-0x200000) + tables
	k, err := New(d, Options{BTF: btftest.TaskFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	task := func(a uint64, pid int, comm string, stack, sp uint64) {
		put32(a+0x30, uint32(pid))
		put32(a+0x34, uint32(pid))
		d.Write(pa(a+0x60), []byte(comm+"\x00"))
		put64(a+0x10, stack)
		put64(a+0x80, sp)
		sig := a + 0x400 // its signal_struct: a thread list of itself
		put64(a+0x40, sig)
		put64(sig+0x10, a+0x48)
		put64(sig+0x18, a+0x48)
		put64(a+0x48, sig+0x10)
		put64(a+0x50, sig+0x10)
	}
	task(initTask, 0, "swapper/0", va(0x8000), va(0x8000+0x3f00))
	task(leader, 1, "init", va(0xc000), va(0xc000+0x3e00))
	task(created, 50, "newborn", va(0x10000), va(0x10000+0x3fc0)) // on no list yet
	// init_task.tasks ↔ leader.tasks
	put64(initTask+0x20, leader+0x20)
	put64(initTask+0x28, leader+0x20)
	put64(leader+0x20, initTask+0x20)
	put64(leader+0x28, initTask+0x20)
	// garbage: "pid" -1627389952 and a comm of "leep" from the middle of a string
	put32(garbage+0x30, 0x9f000000)
	put32(garbage+0x34, 7)
	d.Write(pa(garbage+0x60), []byte("leep\x00"))
	notPrintable := va(0x7800)
	task(notPrintable, 60, "\xff\xfe", va(0x10000), va(0x10000+0x3fc0))
	stray := va(0x7c00) // a plausible pid and comm, but its stack pointer is elsewhere
	task(stray, 61, "sleep", va(0x10000), va(0x30000))
	for _, tc := range []struct {
		name string
		addr uint64
		pid  int
		err  string
	}{
		{"init_task", initTask, 0, ""},
		{"leader", leader, 1, ""},
		{"being created", created, 50, ""},
		{"inside a task", leader + 0x10, 0, "is not a task"},
		{"garbage pid", garbage, 0, "pid -1627389952"},
		{"unprintable comm", notPrintable, 0, "not printable"},
		{"inconsistent", stray, 0, "neither its saved stack pointer"},
		{"unaligned", leader + 3, 0, "not aligned"},
		{"zeroes", va(0x9000), 0, "is not a task"},
	} {
		got, err := k.TaskAt(tc.addr)
		if tc.err == "" {
			if err != nil || got.PID != tc.pid {
				t.Errorf("%s: %+v, %v; want pid %d", tc.name, got, err, tc.pid)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %+v, %v; want an error with %q", tc.name, got, err, tc.err)
		}
	}
}

// TestKernelOffsetProblem: a KERNELOFFSET that does not take the
// kernel's link address to kallsyms' _text, or a VMCOREINFO _stext that
// is not kallsyms', is flagged.
func TestKernelOffsetProblem(t *testing.T) {
	const text = 0xffffffff83000000 // linked at 0xffffffff81000000, slid by 0x2000000
	for _, tc := range []struct {
		name, info string
		want       string // a substring; "" for no problem
	}{
		{"agrees", "KERNELOFFSET=2000000\nSYMBOL(_stext)=ffffffff83000100\n", ""},
		{"no _stext in VMCOREINFO", "KERNELOFFSET=2000000\n", ""},
		{"offset off by a slot", "KERNELOFFSET=2200000\n", "KERNELOFFSET 0x2200000 disagrees with the symbols: kallsyms has _text at 0xffffffff83000000"},
		{"no offset", "", "KERNELOFFSET 0x0 disagrees"},
		{"_stext of another boot", "KERNELOFFSET=2000000\nSYMBOL(_stext)=ffffffff9e000100\n", "another boot"},
	} {
		d := dumptest.New()
		const root = 0x100000
		d.Write(root, make([]byte, 4*pageSize))
		va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
		tables := dumpgen.Kallsyms([]dumpgen.KallsymsSymbol{
			{Addr: text, Type: 'T', Name: "_text"}, {Addr: text + 0x100, Type: 'T', Name: "_stext"},
		}, text, va(0x2000), func(a uint64, b []byte) { d.Write(a-startKernelMap-0x200000+root, b) })
		d.Info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", va(0), root-0x200000) + tc.info + tables
		k, err := New(d, Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := k.KernelOffsetProblem()
		if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
