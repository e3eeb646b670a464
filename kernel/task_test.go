package kernel

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

func taskSpec(t *testing.T, withHot bool) *btf.Spec {
	t.Helper()
	i32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	pid := &btf.Typedef{Name: "pid_t", Type: i32}
	char := &btf.Int{Name: "char", Size: 1}
	anon := &btf.Struct{Size: 8, Members: []btf.Member{{Name: "pid", Type: pid}, {Name: "tgid", Type: pid, Offset: 32}}}
	task := &btf.Struct{Name: "task_struct", Size: 0x900, Members: []btf.Member{
		{Name: "state", Type: i32},
		{Name: "", Type: anon, Offset: 0x5c8 * 8}, // as if under randomized_struct_fields
		{Name: "comm", Type: &btf.Array{Index: i32, Type: char, Nelems: 16}, Offset: 0x7c0 * 8}}}
	types := []btf.Type{task}
	if withHot {
		ptr := &btf.Pointer{Target: task}
		types = append(types, &btf.Struct{Name: "pcpu_hot", Size: 64, Members: []btf.Member{
			{Name: "cpu_number", Type: i32}, {Name: "current_task", Type: ptr, Offset: 64}}})
	}
	return specFromTypes(t, types)
}

func TestTaskLayoutFromBTF(t *testing.T) {
	syms61, err := ParseKallsyms(strings.NewReader("000000000001fb80 A current_task\nffffffff81000000 T _stext\n"))
	if err != nil {
		t.Fatal(err)
	}
	syms62, err := ParseKallsyms(strings.NewReader("0000000000032000 D pcpu_hot\nffffffff81000000 T _stext\n"))
	if err != nil {
		t.Fatal(err)
	}
	none, err := ParseKallsyms(strings.NewReader("ffffffff81000000 T _stext\n"))
	if err != nil {
		t.Fatal(err)
	}
	l, err := TaskLayoutFromBTF(taskSpec(t, false), syms61)
	if err != nil {
		t.Fatal(err)
	}
	if want := (TaskLayout{CurrentTask: 0x1fb80, PID: 0x5c8, TGID: 0x5cc, Comm: 0x7c0}); l != want {
		t.Fatalf("6.1 layout %+v, want %+v", l, want)
	}
	l, err = TaskLayoutFromBTF(taskSpec(t, true), syms62)
	if err != nil {
		t.Fatal(err)
	}
	if l.CurrentTask != 0x32008 {
		t.Fatalf("6.2 current task at %#x, want pcpu_hot+8", l.CurrentTask)
	}
	if _, err := TaskLayoutFromBTF(taskSpec(t, false), none); !errors.Is(err, ErrNoTaskLayout) {
		t.Fatalf("no per-CPU symbol: %v", err)
	}
}
