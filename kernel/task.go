package kernel

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf/btf"
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
	return TaskLayoutFrom(&Types{Spec: spec}, syms)
}

// TaskLayoutFrom is TaskLayoutFromBTF over Types. Its errors match both
// ErrNoTaskLayout and, where BTF lacks a member, ErrLayout.
func TaskLayoutFrom(t *Types, syms *Symbols) (TaskLayout, error) {
	var l TaskLayout
	for _, f := range []struct {
		name string
		dst  *uint32
		size uint32
	}{{"pid", &l.PID, 4}, {"tgid", &l.TGID, 4}, {"comm", &l.Comm, 16}} {
		fl, err := t.Field("task_struct", f.name, f.size)
		if err != nil {
			return l, fmt.Errorf("%w: %w", ErrNoTaskLayout, err)
		}
		*f.dst = fl.Off
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
	off, err := t.Offset("pcpu_hot", "current_task")
	if err != nil {
		return l, fmt.Errorf("%w: %w", ErrNoTaskLayout, err)
	}
	l.CurrentTask = uint32(a) + uint32(off)
	return l, nil
}
