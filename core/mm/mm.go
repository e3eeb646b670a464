// Package mm reads a task's address space out of a kernel's memory, as
// crash's vm command does: the task's mm_struct and its VMAs in address
// order, each with its range, permissions and file. It reads the kernel's
// own structures through kernel/typed (offsets from BTF):
//
//   - 6.1 and later keep a task's VMAs only in the maple tree
//     mm_struct.mm_mt (lib/maple_tree.c): internal nodes
//     (maple_range_64, maple_arange_64) hold child nodes, leaves
//     (maple_leaf_64) the vm_area_structs, in address order;
//   - earlier kernels link them through mm_struct.mmap and
//     vm_area_struct.vm_next.
//
// Every VMA read must name the mm it was found under (vm_mm): a slot a
// torn or corrupt tree left behind is dropped, not reported.
package mm

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/core/vfs"
	"github.com/kinst/kinst/kernel/typed"
)

// Limits a corrupt dump cannot walk past.
const (
	maxVMAs      = 1 << 20
	maxNodes     = 1 << 18
	maxTreeDepth = 16
)

// vm_flags bits (include/linux/mm.h), unchanged since 2.6.
const (
	vmRead     = 0x1
	vmWrite    = 0x2
	vmExec     = 0x4
	vmMayShare = 0x80
)

// VMA is one mapping of an address space; its JSON is `kinst core DUMP
// vm PID --json`'s.
type VMA struct {
	VMA   string `json:"vma"` // struct vm_area_struct
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
	Flags uint64 `json:"flags"` // vm_flags
	// Perms are as /proc/PID/maps prints them: rwx and p (private) or
	// s (VM_MAYSHARE).
	Perms string `json:"perms"`
	// Offset is the file offset of Start (vm_pgoff pages), 0 when anonymous.
	Offset uint64 `json:"offset"`
	File   string `json:"file,omitempty"` // the mapped file's path
	Error  string `json:"error,omitempty"`
}

// Space is a task's address space.
type Space struct {
	MM   uint64 // struct mm_struct; 0 for a kernel thread
	VMAs []VMA
	// Dropped counts tree slots that named no VMA of this mm.
	Dropped int
}

// Reader reads address spaces.
type Reader struct {
	e               *typed.Env
	fs              *vfs.Reader
	task, mm, vma   btf.Type
	listed          bool   // mm_struct.mmap: the VMAs are a list (before 6.1)
	r64Slot, a64Off uint64 // maple_range_64.slot, maple_arange_64.slot
	r64Pivot        uint64 // maple_range_64.pivot: 15 pivots, the last slot's end implied
	rootOff         uint64 // mm_struct.mm_mt.ma_root
}

// New prepares a reader over e (fs names the mapped files); it fails if
// BTF lacks the structs.
func New(e *typed.Env, fs *vfs.Reader) (*Reader, error) {
	r := &Reader{e: e, fs: fs}
	var err error
	for _, t := range []struct {
		p    *btf.Type
		name string
	}{{&r.task, "task_struct"}, {&r.mm, "mm_struct"}, {&r.vma, "vm_area_struct"}} {
		if *t.p, err = e.LookupType("struct " + t.name); err != nil {
			return nil, err
		}
	}
	if _, err := typed.OffsetOf(r.mm, "mmap"); err == nil {
		r.listed = true
		return r, nil
	}
	if r.rootOff, err = typed.OffsetOf(r.mm, "mm_mt.ma_root"); err != nil {
		return nil, fmt.Errorf("mm_struct has neither mmap nor mm_mt: %w", err)
	}
	r64, err1 := e.LookupType("struct maple_range_64")
	a64, err2 := e.LookupType("struct maple_arange_64")
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	if r.r64Slot, err = typed.OffsetOf(r64, "slot"); err != nil {
		return nil, err
	}
	if r.a64Off, err = typed.OffsetOf(a64, "slot"); err != nil {
		return nil, err
	}
	if r.r64Pivot, err = typed.OffsetOf(r64, "pivot"); err != nil {
		return nil, err
	}
	return r, nil
}

// Space reads the address space of the task_struct at task.
func (r *Reader) Space(task uint64) (*Space, error) {
	mmv, err := r.e.Member(typed.Object(r.task, task), "mm")
	if err != nil {
		return nil, err
	}
	mm, err := r.e.Uint(mmv)
	if err != nil {
		return nil, err
	}
	sp := &Space{MM: mm}
	if mm == 0 {
		return sp, nil // a kernel thread
	}
	var addrs []uint64
	if r.listed {
		addrs, err = r.list(mm)
	} else {
		addrs, err = r.tree(mm)
	}
	seen := map[uint64]bool{}
	for _, a := range addrs {
		if seen[a] {
			continue
		}
		seen[a] = true
		v, ok := r.vmaAt(mm, a)
		if !ok {
			sp.Dropped++
			continue
		}
		sp.VMAs = append(sp.VMAs, v)
	}
	slices.SortFunc(sp.VMAs, func(a, b VMA) int { return cmp.Compare(a.Start, b.Start) })
	return sp, err
}

// list follows mm->mmap through vm_next (kernels before 6.1).
func (r *Reader) list(mm uint64) ([]uint64, error) {
	next, err := typed.OffsetOf(r.vma, "vm_next")
	if err != nil {
		return nil, err
	}
	a, err := r.word(mm + must(typed.OffsetOf(r.mm, "mmap")))
	var out []uint64
	for ; err == nil && a != 0; a, err = r.word(a + next) {
		if len(out) == maxVMAs {
			return out, fmt.Errorf("mm %#x: more than %d VMAs: a loop?", mm, maxVMAs)
		}
		out = append(out, a)
	}
	return out, err
}

func must(v uint64, _ error) uint64 { return v }

// tree walks the maple tree mm->mm_mt in order: the root is a node
// pointer with bit 1 set (mt_mk_root), or a single entry; an internal
// node's slots are its children; a node pointer carries its type in bits
// 3..6 (mte_mk_node).
func (r *Reader) tree(mm uint64) ([]uint64, error) {
	root, err := r.word(mm + r.rootOff)
	if err != nil {
		return nil, err
	}
	var out []uint64
	nodes := 0
	// max is the last address the node covers (its parent's pivot for
	// it): a range node's data ends at slot 14 when pivot[14] is max,
	// and before it, as its metadata says, when pivot[14] is 0; only a
	// node whose 15 pivots all end before max uses slot 15 (ma_data_end).
	// The slots past the end hold the metadata, not entries.
	var walk func(enc uint64, depth int, max uint64) error
	walk = func(enc uint64, depth int, max uint64) error {
		if depth == 0 && (enc&3 != 2 || enc < 4096) { // the root is an entry, not a node
			if enc != 0 {
				out = append(out, enc)
			}
			return nil
		}
		if depth > maxTreeDepth || nodes == maxNodes {
			return fmt.Errorf("mm %#x: maple tree deeper than %d or over %d nodes", mm, maxTreeDepth, maxNodes)
		}
		nodes++
		addr := enc &^ 0xff
		var off, n uint64
		leaf := false
		switch (enc >> 3) & 0xf {
		case 1: // maple_leaf_64
			off, n, leaf = r.r64Slot, 16, true
		case 2: // maple_range_64
			off, n = r.r64Slot, 16
		case 3: // maple_arange_64: its metadata lies apart from its slots
			off, n = r.a64Off, 10
		default:
			return fmt.Errorf("maple node %#x: type %d not read", addr, (enc>>3)&0xf)
		}
		b := make([]byte, 8*n)
		if err := r.e.Mem.Read(addr+off, b); err != nil {
			return fmt.Errorf("maple node %#x: %w", addr, err)
		}
		var piv []uint64
		if n == 16 {
			pb := make([]byte, 15*8)
			if err := r.e.Mem.Read(addr+r.r64Pivot, pb); err != nil {
				return fmt.Errorf("maple node %#x: %w", addr, err)
			}
			for i := range 15 {
				piv = append(piv, binary.LittleEndian.Uint64(pb[8*i:]))
			}
			if piv[14] == 0 || piv[14] == max {
				n = 15
			}
		}
		for i := range n {
			v := binary.LittleEndian.Uint64(b[8*i:])
			switch {
			case v == 0:
			case leaf:
				out = append(out, v)
			default:
				cmax := max
				if int(i) < len(piv) && piv[i] != 0 {
					cmax = piv[i]
				}
				if err := walk(v, depth+1, cmax); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return out, walk(root, 0, ^uint64(0))
}

// vmaAt reads the vm_area_struct at a, if it is one of mm's.
func (r *Reader) vmaAt(mm, a uint64) (VMA, bool) {
	v := typed.Object(r.vma, a)
	get := func(path string) (uint64, error) {
		m, err := r.e.Member(v, path)
		if err != nil {
			return 0, err
		}
		return r.e.Uint(m)
	}
	owner, err := get("vm_mm")
	if err != nil || owner != mm {
		return VMA{}, false
	}
	out := VMA{VMA: fmt.Sprintf("%#x", a)}
	var errs []error
	var e error
	out.Start, e = get("vm_start")
	errs = append(errs, e)
	out.End, e = get("vm_end")
	errs = append(errs, e)
	out.Flags, e = get("vm_flags")
	errs = append(errs, e)
	if out.Start >= out.End {
		return VMA{}, false
	}
	out.Perms = perms(out.Flags)
	file, e := get("vm_file")
	errs = append(errs, e)
	if file != 0 {
		pg, e := get("vm_pgoff")
		errs = append(errs, e)
		out.Offset = pg << 12
		out.File, e = r.filePath(file)
		errs = append(errs, e)
	}
	if err := errors.Join(errs...); err != nil {
		out.Error = err.Error()
	}
	return out, true
}

// filePath is the path of the struct file at f.
func (r *Reader) filePath(f uint64) (string, error) {
	ft, err := r.e.LookupType("struct file")
	if err != nil {
		return "", err
	}
	fv := typed.Object(ft, f)
	var p [2]uint64
	for i, path := range []string{"f_path.mnt", "f_path.dentry"} {
		m, err := r.e.Member(fv, path)
		if err != nil {
			return "", err
		}
		if p[i], err = r.e.Uint(m); err != nil {
			return "", err
		}
	}
	return r.fs.Path(p[0], p[1])
}

// perms are vm_flags as /proc/PID/maps shows them.
func perms(f uint64) string {
	b := []byte("---p")
	for i, bit := range []uint64{vmRead, vmWrite, vmExec} {
		if f&bit != 0 {
			b[i] = "rwx"[i]
		}
	}
	if f&vmMayShare != 0 {
		b[3] = 's'
	}
	return string(b)
}

// word reads a pointer.
func (r *Reader) word(a uint64) (uint64, error) {
	var b [8]byte
	if err := r.e.Mem.Read(a, b[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}
