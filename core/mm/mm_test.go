package mm

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/btftest"
	"github.com/kinst/kinst/kernel/typed"
)

type memory map[uint64][]byte // page → bytes

func (m memory) Read(a uint64, b []byte) error {
	for i := range b {
		p := m[(a+uint64(i))&^4095]
		if p == nil {
			return fmt.Errorf("%#x: not in the dump", a+uint64(i))
		}
		b[i] = p[(a+uint64(i))&4095]
	}
	return nil
}

func (m memory) u64(a, v uint64) {
	if m[a&^4095] == nil {
		m[a&^4095] = make([]byte, 4096)
	}
	binary.LittleEndian.PutUint64(m[a&^4095][a&4095:], v)
}

func u64m(name string, off uint32) btf.Member {
	return btftest.Member(name, &btf.Int{Name: "long unsigned int", Size: 8}, off)
}

func ptrm(name string, t btf.Type, off uint32) btf.Member {
	return btftest.Member(name, &btf.Pointer{Target: t}, off)
}

// env is a kernel whose mm_struct keeps its VMAs in a maple tree
// (listed: in the mmap list, as before 6.1):
//
//	struct task_struct { struct mm_struct *mm; };
//	struct mm_struct { struct maple_tree mm_mt; } (or { struct vm_area_struct *mmap; })
//	struct maple_tree { void *ma_root; };
//	struct maple_range_64 { unsigned long pivot[15]; void *slot[16]; };
//	struct maple_arange_64 { unsigned long pivot[9]; void *slot[10]; };
//	struct vm_area_struct { vm_start, vm_end, vm_next, vm_mm, vm_flags, vm_pgoff, vm_file };
func env(t *testing.T, listed bool) *typed.Env {
	vma := &btf.Struct{Name: "vm_area_struct", Size: 56}
	mm := &btf.Struct{Name: "mm_struct", Size: 8}
	void := &btf.Void{}
	file := &btf.Struct{Name: "file", Size: 8}
	vma.Members = []btf.Member{u64m("vm_start", 0), u64m("vm_end", 8), ptrm("vm_next", vma, 16), ptrm("vm_mm", mm, 24),
		u64m("vm_flags", 32), u64m("vm_pgoff", 40), ptrm("vm_file", file, 48)}
	if listed {
		mm.Members = []btf.Member{ptrm("mmap", vma, 0)}
	} else {
		mt := &btf.Struct{Name: "maple_tree", Size: 8, Members: []btf.Member{ptrm("ma_root", void, 0)}}
		mm.Members = []btf.Member{{Name: "mm_mt", Type: mt}}
	}
	u := &btf.Int{Name: "long unsigned int", Size: 8}
	arr := func(n uint32, t btf.Type) *btf.Array { return &btf.Array{Type: t, Index: u, Nelems: n} }
	r64 := &btf.Struct{Name: "maple_range_64", Size: 256, Members: []btf.Member{{Name: "pivot", Type: arr(15, u)}, {Name: "slot", Type: arr(16, &btf.Pointer{Target: void}), Offset: 120 * 8}}}
	a64 := &btf.Struct{Name: "maple_arange_64", Size: 240, Members: []btf.Member{{Name: "pivot", Type: arr(9, u)}, {Name: "slot", Type: arr(10, &btf.Pointer{Target: void}), Offset: 72 * 8}}}
	task := &btf.Struct{Name: "task_struct", Size: 8, Members: []btf.Member{ptrm("mm", mm, 0)}}
	spec := btftest.Spec(t, task, r64, a64, vma)
	return &typed.Env{Spec: spec, Symbol: func(string) (uint64, bool) { return 0, false }}
}

func TestSpace(t *testing.T) {
	const task, mmA, other = 0x1000, 0x2000, 0x3000
	vmas := []struct{ at, start, end, flags uint64 }{
		{0x10000, 0x400000, 0x401000, vmRead | vmExec},
		{0x10100, 0x401000, 0x402000, vmRead | vmWrite},
		{0x10200, 0x7fff0000, 0x7fff1000, vmRead | vmWrite | vmMayShare},
		{0x10300, 0x7ffff000, 0x80000000, 0},
	}
	want := "0x400000-0x401000 r-xp,0x401000-0x402000 rw-p,0x7fff0000-0x7fff1000 rw-s,0x7ffff000-0x80000000 ---p"
	for _, listed := range []bool{false, true} {
		t.Run(fmt.Sprintf("listed=%v", listed), func(t *testing.T) {
			m := memory{}
			m.u64(task, mmA)
			for i, v := range vmas {
				m.u64(v.at, v.start)
				m.u64(v.at+8, v.end)
				m.u64(v.at+24, mmA)
				m.u64(v.at+32, v.flags)
				if listed && i+1 < len(vmas) {
					m.u64(v.at+16, vmas[i+1].at)
				}
			}
			// A slot left naming another mm's VMA: dropped.
			m.u64(0x10400+24, other)
			m.u64(0x10400, 0x500000)
			m.u64(0x10400+8, 0x501000)
			if listed {
				m.u64(mmA, vmas[0].at)
			} else {
				// An arange root over two leaves, the second listed
				// first in neither order nor tree: the walk sorts.
				const root, leaf1, leaf2 = 0x20000, 0x20100, 0x20200
				m.u64(mmA, root|3<<3|2)
				m.u64(root+72, leaf2|1<<3|4)
				m.u64(root+72+8, leaf1|1<<3|4)
				m.u64(leaf1+120, vmas[0].at)
				m.u64(leaf1+120+8, vmas[1].at)
				m.u64(leaf2+120, vmas[2].at)
				m.u64(leaf2+120+16, vmas[3].at)
				m.u64(leaf2+120+24, 0x10400)
				m.u64(leaf2+120+15*8, 0x0f02) // metadata in the last slot: pivot[14] is 0
			}
			e := env(t, listed)
			e.Mem = m
			r, err := New(e, nil)
			if err != nil {
				t.Fatal(err)
			}
			sp, err := r.Space(task)
			if err != nil {
				t.Fatal(err)
			}
			var got string
			for i, v := range sp.VMAs {
				if i > 0 {
					got += ","
				}
				got += fmt.Sprintf("%#x-%#x %s", v.Start, v.End, v.Perms)
			}
			if got != want || sp.MM != mmA {
				t.Errorf("mm %#x, VMAs %s\nwant %s", sp.MM, got, want)
			}
			if !listed && sp.Dropped != 1 {
				t.Errorf("%d slots dropped, want the other mm's VMA", sp.Dropped)
			}
		})
	}
	// A kernel thread has no mm.
	m := memory{}
	m.u64(task, 0)
	e := env(t, false)
	e.Mem = m
	r, _ := New(e, nil)
	if sp, err := r.Space(task); err != nil || sp.MM != 0 || len(sp.VMAs) != 0 {
		t.Errorf("kernel thread: %+v, %v", sp, err)
	}
}

func TestPerms(t *testing.T) {
	for f, want := range map[uint64]string{0: "---p", vmRead: "r--p", vmRead | vmWrite | vmExec: "rwxp", vmRead | vmMayShare: "r--s", vmWrite | 0x8: "-w-p"} {
		if got := perms(f); got != want {
			t.Errorf("perms(%#x) = %s, want %s", f, got, want)
		}
	}
}
