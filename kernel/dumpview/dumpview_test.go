package dumpview

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
	"github.com/kinst/kinst/kernel"
)

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
	// 6.12 writes some numbers as 0x-prefixed addresses.
	v, err = ParseVMCoreInfo("NUMBER(VMALLOC_START)=0xffffd10240000000\nNUMBER(VMEMMAP_START)=0xffffe60000000000\n")
	if err != nil || uint64(v.Numbers["VMALLOC_START"]) != 0xffffd10240000000 || uint64(v.Numbers["VMEMMAP_START"]) != 0xffffe60000000000 {
		t.Errorf("hex NUMBER: %v %+v", err, v)
	}
	for _, bad := range []string{"SYMBOL(x)=zz\n", "no equals sign\n", "NUMBER(n)=1.5\n", "NUMBER(n)=0xzz\n", "KERNELOFFSET=q\n"} {
		if _, err := ParseVMCoreInfo(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := New(dumptest.New(), Options{}); !errors.Is(err, ErrMissing) {
		t.Errorf("a dump without VMCOREINFO: %v", err)
	}
}

// pageTables builds a 4- or 5-level hierarchy in d mapping va to pa with
// a page of the given level (1: 4 KiB, 2: 2 MiB, 3: 1 GiB); tables are
// allocated from *next.
func mapPage(d *dumptest.Mem, root uint64, levels int, va, pa uint64, leaf int, next *uint64) {
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
			d.Put64(slot, e)
			d.Write(*next, make([]byte, pageSize))
		}
		table = e & pteAddrMask
		shift -= 9
	}
	e := pa | ptePresent | 2 | 1<<63 // NX set: must not leak into the address
	if leaf > 1 {
		e |= ptePSE
	}
	d.Put64(table+(va>>shift&511)*8, e)
}

func TestTranslate(t *testing.T) {
	for _, levels := range []int{4, 5} {
		t.Run(fmt.Sprint(levels, "-level"), func(t *testing.T) {
			d := dumptest.New()
			const root = 0x100000
			d.Write(root, make([]byte, pageSize))
			next := uint64(root)
			const vmalloc, direct, huge = 0xffffc90000123000, 0xffff888000400000, 0xffff888040000000
			mapPage(d, root, levels, vmalloc, 0x7000, 1, &next)
			mapPage(d, root, levels, direct, 0x400000, 2, &next)
			mapPage(d, root, levels, huge, 0x40000000, 3, &next)
			d.Info = fmt.Sprintf("OSRELEASE=test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\nNUMBER(pgtable_l5_enabled)=%d\n",
				uint64(startKernelMap+0x200000), root-0x200000, map[int]int{4: 0, 5: 1}[levels])
			v, err := New(d, Options{})
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
					pa, err := v.Translate(tc.va)
					if (err != nil) != tc.err || pa != tc.pa {
						t.Errorf("Translate(%#x) = %#x, %v; want %#x, error %v", tc.va, pa, err, tc.pa, tc.err)
					}
					if err != nil && !errors.Is(err, dump.ErrNotPresent) {
						t.Errorf("Translate(%#x): %v does not match ErrNotPresent", tc.va, err)
					}
				}
			}
			d.Write(0x7ff8, []byte("12345678"))
			d.Write(0x8000, make([]byte, pageSize))
			mapPage(d, root, levels, vmalloc+pageSize, 0x8000, 1, &next)
			d.Write(0x8000, []byte("abcdefgh"))
			v.tlb = map[uint64]uint64{}
			b, err := v.ReadBytes(vmalloc+pageSize-8, 16) // across two non-adjacent pages
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
	base := uint64(startKernelMap + 0x1000000)
	syms := []dumpgen.KallsymsSymbol{
		{Addr: 0x2000, Type: 'A', Name: "fixed_percpu_data"},
		{Addr: base, Type: 'T', Name: "_text"},
		{Addr: base + 0x40, Type: 't', Name: "do_nanosleep"},
		{Addr: base + 0x80, Type: 'T', Name: "schedule"},
		{Addr: base + 0x100, Type: 'D', Name: "init_task"},
		{Addr: base + 0x200, Type: 'T', Name: strings.Repeat("long_name_", 14)},
	}
	d := dumptest.New()
	const physBase = 0x1000000
	put := func(va uint64, b []byte) { d.Write(va-startKernelMap+physBase, b) }
	tables := dumpgen.Kallsyms(syms, base, startKernelMap+0x10000, put)
	d.Info = fmt.Sprintf("OSRELEASE=test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", uint64(startKernelMap+0x20000), physBase) + tables
	v, err := New(d, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := v.KernelSymbols()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Every()); n != len(syms) {
		t.Fatalf("%d symbols, want %d", n, len(syms))
	}
	for _, want := range syms {
		got, err := v.LookupSymbol(want.Name)
		if err != nil || got.Addr != want.Addr || got.Type != want.Type {
			t.Errorf("LookupSymbol(%s) = %+v, %v; want %#x %c", want.Name, got, err, want.Addr, want.Type)
		}
	}
	if got, off, ok := v.SymbolAt(base + 0x44); !ok || got.Name != "do_nanosleep" || off != 4 {
		t.Errorf("SymbolAt(do_nanosleep+4) = %+v %#x %v", got, off, ok)
	}
	if _, err := v.LookupSymbol("nonexistent"); !errors.Is(err, kernel.ErrNoSymbol) {
		t.Errorf("LookupSymbol(nonexistent): %v", err)
	}
	// A names table cut short is an error, not a panic.
	num, _ := v.Info.Need("kallsyms_num_syms")
	put(num[0], binary.LittleEndian.AppendUint32(nil, 1000))
	if _, err := v.loadKallsyms(); err == nil {
		t.Errorf("1000 symbols from a 6-symbol table decoded")
	}
}

// TestCheckTypes: BTF from a file must agree with the layouts VMCOREINFO
// records; entries BTF does not know are not held against it.
func TestCheckTypes(t *testing.T) {
	ulong := &btf.Int{Name: "unsigned long", Size: 8}
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	m := func(name string, typ btf.Type, off uint32) btf.Member {
		return btf.Member{Name: name, Type: typ, Offset: btf.Bits(off * 8)}
	}
	page := &btf.Struct{Name: "page", Size: 64, Members: []btf.Member{m("flags", ulong, 0), m("_refcount", u32, 52)}}
	path := btftest.File(t, "other.btf", page)
	for _, tc := range []struct {
		name, info string
		want       string // a substring of the error; "" for none
	}{
		{"agrees", "SIZE(page)=64\nOFFSET(page.flags)=0\nOFFSET(page._refcount)=52\n", ""},
		{"unknown to BTF", "SIZE(nodemask_t)=8\nOFFSET(zone.free_area)=192\nSIZE(page)=64\n", ""},
		{"size differs", "SIZE(page)=56\nOFFSET(page.flags)=0\n", "SIZE(page) is 56 in VMCOREINFO, 64 in the BTF"},
		{"offset differs", "SIZE(page)=64\nOFFSET(page._refcount)=48\n", "OFFSET(page._refcount) is 48 in VMCOREINFO, 52 in the BTF"},
	} {
		d := dumptest.New()
		d.Info = fmt.Sprintf("OSRELEASE=6.1.0-test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=0\n", uint64(startKernelMap)) + tc.info
		v, err := New(d, Options{BTF: path})
		if err != nil {
			t.Fatal(err)
		}
		_, err = v.Types()
		if tc.want == "" {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if !errors.Is(err, ErrWrongTypes) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "6.1.0-test") || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
