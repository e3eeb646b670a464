package core

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kinst/kinst/core/dump"
	"github.com/kinst/kinst/unwind/orc"
)

// memDump is a dump.Dump over sparse physical pages, for unit tests of
// translation and table decoding (the live tests use real dumps).
type memDump struct {
	pages map[uint64][]byte
	info  string
}

func newMemDump() *memDump { return &memDump{pages: map[uint64][]byte{}} }

func (m *memDump) write(pa uint64, b []byte) {
	for len(b) > 0 {
		p := m.pages[pa&^pageMask]
		if p == nil {
			p = make([]byte, pageSize)
			m.pages[pa&^pageMask] = p
		}
		n := copy(p[pa&pageMask:], b)
		b, pa = b[n:], pa+uint64(n)
	}
}

func (m *memDump) put64(pa, v uint64) { m.write(pa, binary.LittleEndian.AppendUint64(nil, v)) }

func (m *memDump) Format() string { return "test" }
func (m *memDump) ReadPhys(p []byte, pa uint64) (int, error) {
	for done := 0; done < len(p); {
		a := pa + uint64(done)
		pg := m.pages[a&^pageMask]
		if pg == nil {
			return done, &dump.NotPresentError{Addr: a, Physical: true}
		}
		done += copy(p[done:], pg[a&pageMask:])
	}
	return len(p), nil
}
func (m *memDump) VMCoreInfo() string       { return m.info }
func (m *memDump) CPUs() []dump.CPU         { return nil }
func (m *memDump) PhysRanges() []dump.Range { return nil }
func (m *memDump) Close() error             { return nil }

func TestParseVMCoreInfo(t *testing.T) {
	v, err := ParseVMCoreInfo("OSRELEASE=6.1.0-56-amd64\nPAGESIZE=4096\nSYMBOL(swapper_pg_dir)=ffffffff98e10000\n" +
		"OFFSET(list_head.next)=0\nSIZE(page)=64\nLENGTH(zone.free_area)=11\nNUMBER(phys_base)=-85983232\nKERNELOFFSET=16400000\n")
	if err != nil {
		t.Fatal(err)
	}
	if v.OSRelease != "6.1.0-56-amd64" || v.Symbols["swapper_pg_dir"] != 0xffffffff98e10000 || v.Offsets["list_head.next"] != 0 ||
		v.Sizes["page"] != 64 || v.Lengths["zone.free_area"] != 11 || v.Numbers["phys_base"] != -85983232 || v.KernelOffset != 0x16400000 ||
		v.Raw["PAGESIZE"] != "4096" {
		t.Errorf("%+v", v)
	}
	for _, bad := range []string{"SYMBOL(x)=zz\n", "no equals sign\n", "NUMBER(n)=1.5\n", "KERNELOFFSET=q\n"} {
		if _, err := ParseVMCoreInfo(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := New(newMemDump(), Options{}); !errors.Is(err, ErrMissing) {
		t.Errorf("a dump without VMCOREINFO: %v", err)
	}
}

// pageTables builds a 4- or 5-level hierarchy in d mapping va to pa with
// a page of the given level (1: 4 KiB, 2: 2 MiB, 3: 1 GiB); tables are
// allocated from *next.
func mapPage(d *memDump, root uint64, levels int, va, pa uint64, leaf int, next *uint64) {
	table := root
	shift := uint(12 + 9*(levels-1))
	for level := levels; level > leaf; level-- {
		slot := table + (va>>shift&511)*8
		var b [8]byte
		d.ReadPhys(b[:], slot)
		e := binary.LittleEndian.Uint64(b[:])
		if e&ptePresent == 0 {
			*next += pageSize
			e = *next | ptePresent | 2
			d.put64(slot, e)
			d.write(*next, make([]byte, pageSize))
		}
		table = e & pteAddrMask
		shift -= 9
	}
	e := pa | ptePresent | 2 | 1<<63 // NX set: must not leak into the address
	if leaf > 1 {
		e |= ptePSE
	}
	d.put64(table+(va>>shift&511)*8, e)
}

func TestTranslate(t *testing.T) {
	for _, levels := range []int{4, 5} {
		t.Run(fmt.Sprint(levels, "-level"), func(t *testing.T) {
			d := newMemDump()
			const root = 0x100000
			d.write(root, make([]byte, pageSize))
			next := uint64(root)
			const vmalloc, direct, huge = 0xffffc90000123000, 0xffff888000400000, 0xffff888040000000
			mapPage(d, root, levels, vmalloc, 0x7000, 1, &next)
			mapPage(d, root, levels, direct, 0x400000, 2, &next)
			mapPage(d, root, levels, huge, 0x40000000, 3, &next)
			d.info = fmt.Sprintf("OSRELEASE=test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\nNUMBER(pgtable_l5_enabled)=%d\n",
				uint64(startKernelMap+0x200000), root-0x200000, map[int]int{4: 0, 5: 1}[levels])
			k, err := New(d, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				va, pa uint64
				err    bool
			}{
				{vmalloc + 0x10, 0x7010, false},
				{direct + 0x1234, 0x401234, false},
				{huge + 0x3456789, 0x43456789, false},
				{startKernelMap + 0x200008, root + 8, false}, // the image: linear at phys_base
				{vmalloc + pageSize, 0, true},
				{0xffffea0000000000, 0, true},
			} {
				for range 2 { // the second time from the cache
					pa, err := k.Translate(tc.va)
					if (err != nil) != tc.err || pa != tc.pa {
						t.Errorf("Translate(%#x) = %#x, %v; want %#x, error %v", tc.va, pa, err, tc.pa, tc.err)
					}
					if err != nil && !errors.Is(err, dump.ErrNotPresent) {
						t.Errorf("Translate(%#x): %v does not match ErrNotPresent", tc.va, err)
					}
				}
			}
			d.write(0x7ff8, []byte("12345678"))
			d.write(0x8000, make([]byte, pageSize))
			mapPage(d, root, levels, vmalloc+pageSize, 0x8000, 1, &next)
			d.write(0x8000, []byte("abcdefgh"))
			k.tlb = map[uint64]uint64{}
			b, err := k.ReadBytes(vmalloc+pageSize-8, 16) // across two non-adjacent pages
			if err != nil || string(b) != "12345678abcdefgh" {
				t.Errorf("ReadBytes across pages: %q, %v", b, err)
			}
		})
	}
}

// TestKallsyms encodes a small symbol table the way scripts/kallsyms.c
// does (token-compressed names with the type letter first, one long name
// with a two-byte length, relative offsets with an absolute per-CPU one)
// and decodes it from the dump.
func TestKallsyms(t *testing.T) {
	type sym struct {
		addr uint64
		typ  byte
		name string
	}
	base := uint64(startKernelMap + 0x1000000)
	syms := []sym{
		{0x2000, 'A', "fixed_percpu_data"},
		{base, 'T', "_text"},
		{base + 0x40, 't', "do_nanosleep"},
		{base + 0x80, 'T', "schedule"},
		{base + 0x100, 'D', "init_task"},
		{base + 0x200, 'T', strings.Repeat("long_name_", 14)},
	}
	// Tokens: every byte stands for itself, except 0xf0 = "sch" and
	// 0xf1 = "ed" (a multi-byte token).
	var tokTable []byte
	var tokIndex []byte
	for i := 0; i < 256; i++ {
		tokIndex = binary.LittleEndian.AppendUint16(tokIndex, uint16(len(tokTable)))
		switch i {
		case 0xf0:
			tokTable = append(tokTable, "sch"...)
		case 0xf1:
			tokTable = append(tokTable, "ed"...)
		default:
			tokTable = append(tokTable, byte(i))
		}
		tokTable = append(tokTable, 0)
	}
	var names, offsets []byte
	for _, s := range syms {
		full := string(s.typ) + s.name
		enc := []byte(strings.Replace(strings.Replace(full, "sch", "\xf0", 1), "ed", "\xf1", 1))
		if len(enc) > 127 {
			names = append(names, byte(len(enc)&0x7f|0x80), byte(len(enc)>>7))
		} else {
			names = append(names, byte(len(enc)))
		}
		names = append(names, enc...)
		// KALLSYMS_ABSOLUTE_PERCPU: a non-negative offset is the value
		// itself (per-CPU symbols); others are -1 - (addr - base).
		rel := int32(-1 - int64(s.addr-base))
		if s.typ == 'A' {
			rel = int32(s.addr)
		}
		offsets = binary.LittleEndian.AppendUint32(offsets, uint32(rel))
	}
	d := newMemDump()
	const physBase = 0x1000000
	at := func(off uint64) uint64 { return startKernelMap + off }
	put := func(off uint64, b []byte) { d.write(off+physBase, b) }
	put(0x10000, offsets)
	put(0x11000, binary.LittleEndian.AppendUint64(nil, base))
	put(0x11008, binary.LittleEndian.AppendUint32(nil, uint32(len(syms))))
	put(0x12000, make([]byte, 0x2000))
	put(0x12000, names)
	put(0x14000, tokTable)
	put(0x15000, tokIndex)
	d.info = fmt.Sprintf("OSRELEASE=test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n"+
		"SYMBOL(kallsyms_offsets)=%x\nSYMBOL(kallsyms_relative_base)=%x\nSYMBOL(kallsyms_num_syms)=%x\n"+
		"SYMBOL(kallsyms_names)=%x\nSYMBOL(kallsyms_token_table)=%x\nSYMBOL(kallsyms_token_index)=%x\n",
		at(0x20000), physBase, at(0x10000), at(0x11000), at(0x11008), at(0x12000), at(0x14000), at(0x15000))
	k, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := k.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != len(syms) {
		t.Fatalf("%d symbols, want %d", s.Len(), len(syms))
	}
	for _, want := range syms {
		got, err := s.Lookup(want.name)
		if err != nil || got.Addr != want.addr || got.Type != want.typ {
			t.Errorf("Lookup(%s) = %+v, %v; want %#x %c", want.name, got, err, want.addr, want.typ)
		}
	}
	if got, off, ok := s.At(base + 0x44); !ok || got.Name != "do_nanosleep" || off != 4 {
		t.Errorf("At(do_nanosleep+4) = %+v %#x %v", got, off, ok)
	}
	if _, err := s.Lookup("nonexistent"); !errors.Is(err, ErrNoSymbol) {
		t.Errorf("Lookup(nonexistent): %v", err)
	}
	// A names table cut short is an error, not a panic.
	d.write(0x11008+physBase, binary.LittleEndian.AppendUint32(nil, 1000))
	if _, err := k.loadKallsyms(); err == nil {
		t.Errorf("1000 symbols from a 6-symbol table decoded")
	}
}

func TestStateLetter(t *testing.T) {
	for _, tc := range []struct {
		state, exit uint32
		want        string
	}{
		{0, 0, "R"}, {1, 0, "S"}, {2, 0, "D"}, {4, 0, "T"}, {8, 0, "t"}, {0, 0x10, "X"}, {0, 0x20, "Z"},
		{0x40, 0, "P"}, {0x402, 0, "I"}, {0x81, 0, "S"}, // TASK_WAKEKILL|INTERRUPTIBLE reports S
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
	d := newMemDump()
	const root = 0x100000
	d.write(root, make([]byte, pageSize))
	d.info = fmt.Sprintf("OSRELEASE=test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", uint64(startKernelMap+0x200000), root-0x200000)
	k, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// head → a → b → head, in the image mapping (physical = va - map + phys_base).
	va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
	pa := func(off uint64) uint64 { return root + off }
	d.put64(pa(0x100), va(0x200))
	d.put64(pa(0x200), va(0x300))
	d.put64(pa(0x300), va(0x100))
	var got []uint64
	if err := k.walkList(va(0x100), 8, func(e uint64) error { got = append(got, e); return nil }); err != nil || len(got) != 2 || got[0] != va(0x1f8) || got[1] != va(0x2f8) {
		t.Errorf("walk: %#x, %v", got, err)
	}
	d.put64(pa(0x300), va(0x200)) // b → a: a loop that skips head
	if err := k.walkList(va(0x100), 8, func(uint64) error { return nil }); err == nil || !strings.Contains(err.Error(), "loops") {
		t.Errorf("looping list: %v", err)
	}
	d.put64(pa(0x300), 0xffffc90000000000) // into unmapped memory
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
		d := newMemDump()
		const root = 0x100000
		d.write(root, make([]byte, 4*pageSize))
		d.write(root, mem[:min(len(mem), 4*pageSize)])
		// prb (at image offset 0x200000) points to the ring at +0x100.
		d.put64(root, startKernelMap+0x200100)
		d.info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\nSYMBOL(prb)=%x\n",
			uint64(startKernelMap+0x200000), root-0x200000, uint64(startKernelMap+0x200000)) + info
		k, err := New(d, Options{})
		if err != nil {
			return
		}
		k.Log()
	})
}

// TestBacktraceThroughModule: a switched-out task whose stack runs from a
// kernel function through a module's function (found by the module's own
// ORC table and symbols) to a kernel thread's outermost frame.
func TestBacktraceThroughModule(t *testing.T) {
	d := newMemDump()
	const root = 0x100000
	d.write(root, make([]byte, 4*pageSize))
	d.info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", uint64(startKernelMap+0x200000), root-0x200000)
	k, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const (
		kSched  = startKernelMap + 0x1000000
		kThread = startKernelMap + 0x1000100
		modBase = 0xffffffffc0100000
		modWait = modBase + 0x40
	)
	table := func(rows ...[2]any) *orc.Table {
		var ips, ents []byte
		for i, r := range rows {
			ips = binary.LittleEndian.AppendUint32(ips, uint32(int32(int64(r[0].(uint64))-int64(0x1000+4*i))))
			e := r[1].(orc.Entry)
			bits := uint16(e.SPReg) | uint16(e.BPReg)<<4 | uint16(e.Type)<<8
			if e.End {
				bits |= 1 << 10
			}
			ents = binary.LittleEndian.AppendUint16(binary.LittleEndian.AppendUint16(binary.LittleEndian.AppendUint16(ents, uint16(e.SPOffset)), uint16(e.BPOffset)), bits)
		}
		// The table claims to sit at 0x1000; entries are relative to it.
		tab, err := orc.Parse(ips, 0x1000, ents)
		if err != nil {
			t.Fatal(err)
		}
		return tab
	}
	kernelORC := table([2]any{uint64(kSched), orc.Entry{SPOffset: 16, SPReg: orc.RegSP}}, [2]any{uint64(kThread), orc.Entry{End: true}})
	modORC := table([2]any{uint64(modWait), orc.Entry{SPOffset: 8, SPReg: orc.RegSP}})
	k.orc.get("ORC", func() (*orcTables, error) { return &orcTables{kernel: kernelORC}, nil })
	k.syms.get("kallsyms", func() (*Symbols, error) {
		return &Symbols{byAddr: []Symbol{{kSched, 't', "kfn_sched", ""}, {kThread, 'T', "kthread", ""}}}, nil
	})
	k.mods.get("modules", func() ([]*Module, error) {
		return []*Module{{Name: "mod", Base: modBase, Size: 0x1000, TextSize: 0x800, orc: modORC,
			syms: []Symbol{{modWait, 't', "mod_wait", "mod"}}}}, nil
	})
	// The stack, in the image mapping: the switch frame, then kfn_sched's
	// pushed word and return into mod_wait, then the return into kthread.
	stack := uint64(startKernelMap + 0x200800)
	put := func(va, v uint64) { d.put64(va-startKernelMap-0x200000+root, v) }
	put(stack+5*8, 0)           // bp
	put(stack+6*8, kSched+5)    // ret_addr: where the task will resume
	put(stack+56+8, modWait+3)  // return into the module
	put(stack+56+16, kThread+7) // return into kthread
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
