package dumpgen

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// LinuxInitTask is where LinuxKdump's init_task lies.
const LinuxInitTask = 0xffffffff80208000

// LinuxKdump writes a kdump whose kernel image (mapped at
// 0xffffffff80200000, physical 0x400000) holds kallsyms, an empty printk
// ring and init_task alone on its task list; exclude leaves init_task's
// page out, as a filtered or cut-short dump would. Its task_struct
// layout is btftest.TaskFile's; it returns the dump's path, in a
// temporary directory.
func LinuxKdump(t testing.TB, exclude bool) string {
	t.Helper()
	const (
		mapBase = 0xffffffff80000000 + 0x200000
		root    = 0x400000
	)
	va := func(off uint64) uint64 { return mapBase + off }
	pages := map[uint64][]byte{}
	for p := uint64(0); p < 16; p++ {
		pages[root/4096+p] = make([]byte, 4096)
	}
	put := func(a uint64, b []byte) {
		for i, c := range b {
			pa := a - mapBase + root + uint64(i)
			pages[pa/4096][pa%4096] = c
		}
	}
	put64 := func(a, v uint64) { put(a, binary.LittleEndian.AppendUint64(nil, v)) }
	initTask, prb, ring, zeros := va(0x8000), va(0x80), va(0x100), va(0x3000)
	tables := Kallsyms([]KallsymsSymbol{
		{Addr: va(0), Type: 'T', Name: "_text"}, {Addr: initTask, Type: 'D', Name: "init_task"},
	}, va(0), va(0x1000), put)
	// The ring: no descriptors in use.
	put64(prb, ring)
	put64(ring+8, zeros)
	put64(ring+16, zeros)
	put64(ring+56, zeros)
	layout := "OFFSET(printk_ringbuffer.desc_ring)=0\nOFFSET(printk_ringbuffer.text_data_ring)=48\n" +
		"OFFSET(prb_desc_ring.count_bits)=0\nOFFSET(prb_desc_ring.descs)=8\nOFFSET(prb_desc_ring.infos)=16\n" +
		"OFFSET(prb_desc_ring.head_id)=24\nOFFSET(prb_desc_ring.tail_id)=32\nOFFSET(prb_desc.state_var)=0\n" +
		"OFFSET(prb_desc.text_blk_lpos)=8\nOFFSET(prb_data_blk_lpos.begin)=0\nOFFSET(prb_data_blk_lpos.next)=8\n" +
		"OFFSET(prb_data_ring.size_bits)=0\nOFFSET(prb_data_ring.data)=8\nOFFSET(printk_info.seq)=0\n" +
		"OFFSET(printk_info.ts_nsec)=8\nOFFSET(printk_info.text_len)=16\nSIZE(prb_desc)=24\nSIZE(printk_info)=88\n"
	// init_task: pid 0, "swapper/0", its tasks and thread lists empty.
	put(initTask+0x60, []byte("swapper/0\x00"))
	put64(initTask+0x20, initTask+0x20)
	put64(initTask+0x28, initTask+0x20)
	sig := initTask + 0x400
	put64(initTask+0x40, sig)
	put64(sig+0x10, initTask+0x48)
	put64(sig+0x18, initTask+0x48)
	put64(initTask+0x48, sig+0x10)
	put64(initTask+0x50, sig+0x10)
	g := &Kdump{MaxMapnr: 0x800, Release: "6.1.0-test", PhysBase: root - 0x200000, Pages: pages,
		VMCoreInfo: fmt.Sprintf("OSRELEASE=6.1.0-test\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\nSYMBOL(prb)=%x\n", va(0), root-0x200000, prb) + layout + tables}
	if exclude {
		pfn := (initTask - mapBase + root) / 4096
		delete(pages, pfn)
		g.Excluded = []uint64{pfn}
	}
	b, err := g.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "vmcore")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
