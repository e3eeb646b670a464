package core

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/kinst/kinst/core/dump/dumptest"
	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/internal/dumpgen"
)

// liveMem is a test memory that says it is a running system's.
type liveMem struct{ *dumptest.Mem }

func (liveMem) Live() bool { return true }

// TestLiveTasks: a thread list cut while it is read (a task exiting on a
// live system) is an error in a dump, and in live memory a skipped,
// listed item with the other tasks still reported.
func TestLiveTasks(t *testing.T) {
	for _, tc := range []struct {
		name      string
		live      bool
		cut       bool
		wantErr   bool
		wantTasks int
		anomalies int
	}{
		{"dump, intact", false, false, false, 2, 0},
		{"dump, cut list", false, true, true, 0, 0},
		{"live, intact", true, false, false, 2, 0},
		{"live, cut list", true, true, false, 2, 1},
	} {
		d := dumptest.New()
		const root = 0x100000
		d.Write(root, make([]byte, 20*pageSize))
		va := func(off uint64) uint64 { return startKernelMap + 0x200000 + off }
		pa := func(a uint64) uint64 { return a - startKernelMap - 0x200000 + root }
		put64 := func(a, v uint64) { d.Put64(pa(a), v) }
		put32 := func(a uint64, v uint32) { d.Write(pa(a), binary.LittleEndian.AppendUint32(nil, v)) }
		initTask, leader := va(0x4000), va(0x5000)
		tables := dumpgen.Kallsyms([]dumpgen.KallsymsSymbol{
			{Addr: va(0), Type: 'T', Name: "_text"}, {Addr: initTask, Type: 'D', Name: "init_task"},
		}, va(0), va(0x2000), func(a uint64, b []byte) { d.Write(pa(a), b) })
		d.Info = fmt.Sprintf("OSRELEASE=t\nSYMBOL(init_top_pgt)=%x\nNUMBER(phys_base)=%d\n", va(0), root-0x200000) + tables
		var k *Kernel
		var err error
		if tc.live {
			k, err = New(liveMem{d}, Options{BTF: btftest.TaskFile(t)})
		} else {
			k, err = New(d, Options{BTF: btftest.TaskFile(t)})
		}
		if err != nil {
			t.Fatal(err)
		}
		task := func(a uint64, pid int, comm string) {
			put32(a+0x30, uint32(pid))
			put32(a+0x34, uint32(pid))
			d.Write(pa(a+0x60), []byte(comm+"\x00"))
			sig := a + 0x400
			put64(a+0x40, sig)
			put64(sig+0x10, a+0x48)
			put64(sig+0x18, a+0x48)
			put64(a+0x48, sig+0x10)
			put64(a+0x50, sig+0x10)
		}
		task(initTask, 0, "swapper/0")
		task(leader, 1, "init")
		put64(initTask+0x20, leader+0x20)
		put64(initTask+0x28, leader+0x20)
		put64(leader+0x20, initTask+0x20)
		put64(leader+0x28, initTask+0x20)
		if tc.cut {
			// The leader's thread list now leads into unmapped memory.
			put64(leader+0x48, va(0x1f0000))
		}
		ts, err := k.Tasks()
		if (err != nil) != tc.wantErr || (!tc.wantErr && len(ts) != tc.wantTasks) || len(k.TaskAnomalies()) != tc.anomalies {
			t.Errorf("%s: %d tasks, %v, anomalies %q; want %d tasks, error %v, %d anomalies", tc.name, len(ts), err, k.TaskAnomalies(), tc.wantTasks, tc.wantErr, tc.anomalies)
		}
		if k.Live() != tc.live {
			t.Errorf("%s: Live() = %v", tc.name, k.Live())
		}
	}
}
