package dumpgen

import (
	"os"
	"path/filepath"

	"github.com/cilium/ebpf/btf"
)

// WriteTaskBTF writes, as dir/tasks.btf, raw BTF describing task_struct
// (0x100 bytes) and signal_struct with the members the task walk reads,
// at offsets of its own: cpu 0x08, __state 0x0c, stack 0x10, tasks 0x20,
// pid 0x30, tgid 0x34, exit_state 0x38, signal 0x40, thread_node 0x48,
// comm[16] 0x60, thread.sp 0x80; signal_struct.thread_head 0x10.
func WriteTaskBTF(dir string) (string, error) {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	s32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	char := &btf.Int{Name: "char", Size: 1, Encoding: btf.Char}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	m := func(name string, typ btf.Type, off uint32) btf.Member {
		return btf.Member{Name: name, Type: typ, Offset: btf.Bits(off * 8)}
	}
	list := &btf.Struct{Name: "list_head", Size: 16, Members: []btf.Member{m("next", ptr, 0), m("prev", ptr, 8)}}
	thread := &btf.Struct{Name: "thread_struct", Size: 16, Members: []btf.Member{m("sp", ptr, 0)}}
	task := &btf.Struct{Name: "task_struct", Size: 0x100, Members: []btf.Member{
		m("cpu", u32, 0x08), m("__state", u32, 0x0c), m("stack", ptr, 0x10), m("tasks", list, 0x20),
		m("pid", s32, 0x30), m("tgid", s32, 0x34), m("exit_state", s32, 0x38), m("signal", ptr, 0x40),
		m("thread_node", list, 0x48), m("comm", &btf.Array{Index: u32, Type: char, Nelems: 16}, 0x60),
		m("thread", thread, 0x80)}}
	sig := &btf.Struct{Name: "signal_struct", Size: 0x40, Members: []btf.Member{m("thread_head", list, 0x10)}}
	b, err := btf.NewBuilder([]btf.Type{task, sig}, nil)
	if err != nil {
		return "", err
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "tasks.btf")
	return path, os.WriteFile(path, raw, 0o600)
}
