package kernel

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/btf"

	"github.com/kinst/kinst/internal/kbtf"
)

// TaskLayout is how instrumentation finds the running task and reads its
// identity: the %gs-relative offset of the per-CPU current-task pointer,
// and the byte offsets of task_struct's pid, tgid and comm, all from the
// running kernel (kallsyms and BTF), never from constants — task_struct's
// layout changes with every kernel configuration.
type TaskLayout struct {
	CurrentTask uint32 // %gs:CurrentTask holds the running task_struct *
	PID         uint32 // thread id
	TGID        uint32 // process id
	Comm        uint32 // char comm[16]
}

// ErrNoTaskLayout is matched by errors of TaskLayoutFromBTF.
var ErrNoTaskLayout = errors.New("cannot locate the current task")

// TaskLayoutFromBTF locates the fields in spec and the current-task
// pointer through syms: the per-CPU variable current_task up to 6.1,
// pcpu_hot.current_task from 6.2 on. Per-CPU symbols are offsets from the
// per-CPU base, which %gs holds in the kernel; KASLR does not move them.
func TaskLayoutFromBTF(spec *btf.Spec, syms *Symbols) (TaskLayout, error) {
	var l TaskLayout
	var task *btf.Struct
	if err := spec.TypeByName("task_struct", &task); err != nil {
		return l, fmt.Errorf("%w: task_struct in BTF: %v", ErrNoTaskLayout, err)
	}
	for _, f := range []struct {
		name string
		dst  *uint32
		size uint32
	}{{"pid", &l.PID, 4}, {"tgid", &l.TGID, 4}, {"comm", &l.Comm, 16}} {
		off, size, err := memberOffset(task, f.name)
		if err != nil {
			return l, err
		}
		if size != f.size {
			return l, fmt.Errorf("%w: task_struct.%s is %d bytes, want %d", ErrNoTaskLayout, f.name, size, f.size)
		}
		*f.dst = off
	}
	if a, ok := syms.Address("current_task"); ok {
		if a >= 1<<31 {
			return l, fmt.Errorf("%w: current_task at %#x is not a per-CPU offset", ErrNoTaskLayout, a)
		}
		l.CurrentTask = uint32(a)
		return l, nil
	}
	a, ok := syms.Address("pcpu_hot")
	if !ok || a >= 1<<31 {
		return l, fmt.Errorf("%w: neither current_task nor pcpu_hot is a per-CPU symbol in kallsyms", ErrNoTaskLayout)
	}
	var hot *btf.Struct
	if err := spec.TypeByName("pcpu_hot", &hot); err != nil {
		return l, fmt.Errorf("%w: pcpu_hot in BTF: %v", ErrNoTaskLayout, err)
	}
	off, _, err := memberOffset(hot, "current_task")
	if err != nil {
		return l, err
	}
	l.CurrentTask = uint32(a) + off
	return l, nil
}

// LoadTaskLayout reads the running kernel's BTF.
func LoadTaskLayout(syms *Symbols) (TaskLayout, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return TaskLayout{}, fmt.Errorf("kernel BTF: %w", err)
	}
	return TaskLayoutFromBTF(spec, syms)
}

// memberOffset finds a member by name, looking into anonymous structs and
// unions, and returns its byte offset and size.
func memberOffset(s btf.Type, name string) (uint32, uint32, error) {
	m, ok := kbtf.Member(s, name)
	off, t := m.Offset, m.Type
	if !ok {
		return 0, 0, fmt.Errorf("%w: no member %s", ErrNoTaskLayout, name)
	}
	if off%8 != 0 {
		return 0, 0, fmt.Errorf("%w: member %s is a bitfield", ErrNoTaskLayout, name)
	}
	size, err := btf.Sizeof(t)
	if err != nil {
		return 0, 0, fmt.Errorf("%w: member %s: %v", ErrNoTaskLayout, name, err)
	}
	return uint32(off / 8), uint32(size), nil
}
