// Package btftest builds BTF for tests: types marshalled to raw BTF and
// loaded back, so a test goes through the same decoding as a kernel's own
// BTF, and the small task_struct description the task-walk tests share.
package btftest

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// Raw marshals types to raw BTF.
func Raw(tb testing.TB, types ...btf.Type) []byte {
	tb.Helper()
	b, err := btf.NewBuilder(types, nil)
	if err != nil {
		tb.Fatal(err)
	}
	raw, err := b.Marshal(nil, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return raw
}

// Spec marshals types to raw BTF and loads it back.
func Spec(tb testing.TB, types ...btf.Type) *btf.Spec {
	tb.Helper()
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(Raw(tb, types...)))
	if err != nil {
		tb.Fatal(err)
	}
	return spec
}

// File writes types as raw BTF to a file named name in a temporary
// directory and returns its path.
func File(tb testing.TB, name string, types ...btf.Type) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), name)
	if err := os.WriteFile(path, Raw(tb, types...), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Member is a member named name of type typ at byte offset off.
func Member(name string, typ btf.Type, off uint32) btf.Member {
	return btf.Member{Name: name, Type: typ, Offset: btf.Bits(off * 8)}
}

// TaskFile writes BTF describing task_struct (0x100 bytes) and
// signal_struct with the members the task walk reads, at offsets of its
// own: cpu 0x08, __state 0x0c, stack 0x10, tasks 0x20, pid 0x30, tgid
// 0x34, exit_state 0x38, signal 0x40, thread_node 0x48, comm[16] 0x60,
// thread.sp 0x80; signal_struct.thread_head 0x10.
func TaskFile(tb testing.TB) string {
	tb.Helper()
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	s32 := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	char := &btf.Int{Name: "char", Size: 1, Encoding: btf.Char}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	m := Member
	list := &btf.Struct{Name: "list_head", Size: 16, Members: []btf.Member{m("next", ptr, 0), m("prev", ptr, 8)}}
	thread := &btf.Struct{Name: "thread_struct", Size: 16, Members: []btf.Member{m("sp", ptr, 0)}}
	task := &btf.Struct{Name: "task_struct", Size: 0x100, Members: []btf.Member{
		m("cpu", u32, 0x08), m("__state", u32, 0x0c), m("stack", ptr, 0x10), m("tasks", list, 0x20),
		m("pid", s32, 0x30), m("tgid", s32, 0x34), m("exit_state", s32, 0x38), m("signal", ptr, 0x40),
		m("thread_node", list, 0x48), m("comm", &btf.Array{Index: u32, Type: char, Nelems: 16}, 0x60),
		m("thread", thread, 0x80)}}
	sig := &btf.Struct{Name: "signal_struct", Size: 0x40, Members: []btf.Member{m("thread_head", list, 0x10)}}
	return File(tb, "tasks.btf", task, sig)
}
