package kerninstdtest

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// TextAddr is where the test kernel's text starts.
const TextAddr = 0xffffffff81000000

// A function of the test kernel: its name and code, where rel32 holes
// (call or jmp to another function) are filled in by name.
type function struct {
	name string
	code []byte
	// calls: offset of a rel32 → the function it reaches.
	calls map[int]string
}

// funcSize is the room every function of the test kernel gets; the rest
// is int3 padding.
const funcSize = 0x30

var (
	ftraceNop = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00} // nopl 0x0(%rax,%rax,1): the ftrace site
	prologue  = []byte{0x55, 0x48, 0x89, 0xe5}       // push %rbp; mov %rsp,%rbp
	loadRAX   = []byte{0x48, 0x8b, 0x05, 0xd0, 0x0f, 0x00, 0x00}
	popRBP    = []byte{0x5d}
	rel32Hole = []byte{0, 0, 0, 0}
)

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Functions of the test kernel, laid out from TextAddr funcSize apart:
// do_sys_openat2 (KernInst's copen) calls do_filp_open and putname;
// do_filp_open calls path_openat; filename_lookup (lookuppn) is shaped
// like the real one. Each returns through __x86_return_thunk, as a
// retpoline kernel's functions do.
var functions = []function{
	{name: "do_sys_openat2", code: cat(ftraceNop, prologue, loadRAX, // +0x09: the entry point
		[]byte{0xe8}, rel32Hole, // +0x10 call do_filp_open
		[]byte{0xe8}, rel32Hole, // +0x15 call putname
		popRBP,                   // +0x1a
		[]byte{0xe9}, rel32Hole), // +0x1b jmp __x86_return_thunk
		calls: map[int]string{0x11: "do_filp_open", 0x16: "putname", 0x1c: "__x86_return_thunk"}},
	{name: "do_filp_open", code: cat(ftraceNop, prologue, loadRAX, // +0x09
		[]byte{0xe8}, rel32Hole, // +0x10 call path_openat
		popRBP,                   // +0x15
		[]byte{0xe9}, rel32Hole), // +0x16 jmp __x86_return_thunk
		calls: map[int]string{0x11: "path_openat", 0x17: "__x86_return_thunk"}},
	{name: "path_openat", code: cat(ftraceNop, prologue, loadRAX,
		[]byte{0x48, 0x85, 0xc0}, // +0x10 test %rax,%rax
		[]byte{0x74, 0x02},       // +0x13 je +0x17
		[]byte{0x31, 0xc0},       // +0x15 xor %eax,%eax
		popRBP,                   // +0x17
		[]byte{0xe9}, rel32Hole), // +0x18 jmp __x86_return_thunk
		calls: map[int]string{0x19: "__x86_return_thunk"}},
	{name: "putname", code: cat(ftraceNop, prologue, loadRAX,
		popRBP,                   // +0x10
		[]byte{0xe9}, rel32Hole), // +0x11 jmp __x86_return_thunk
		calls: map[int]string{0x12: "__x86_return_thunk"}},
	{name: "filename_lookup", code: cat(ftraceNop, prologue,
		[]byte{0x41, 0x54},       // +0x09 push %r12
		loadRAX,                  // +0x0b mov 0xfd0(%rip),%rax: the entry point
		[]byte{0x48, 0x85, 0xc0}, // +0x12 test %rax,%rax
		[]byte{0x74, 0x05},       // +0x15 je +0x1c
		[]byte{0xe8}, rel32Hole,  // +0x17 call path_openat
		[]byte{0x41, 0x5c},       // +0x1c pop %r12
		popRBP,                   // +0x1e
		[]byte{0xe9}, rel32Hole), // +0x1f jmp __x86_return_thunk
		calls: map[int]string{0x18: "path_openat", 0x20: "__x86_return_thunk"}},
	{name: "__x86_return_thunk", code: []byte{0xc3}},
	{name: "exc_int3", code: []byte{0xc3}},
}

// Text returns the test kernel's text, starting at TextAddr, and its
// symbol table in /proc/kallsyms's format.
func Text() ([]byte, string) {
	addr := map[string]uint64{}
	for i, f := range functions {
		addr[f.name] = TextAddr + uint64(i*funcSize)
	}
	text := make([]byte, len(functions)*funcSize)
	for i := range text {
		text[i] = 0xcc
	}
	var syms strings.Builder
	for i, f := range functions {
		at := text[i*funcSize:]
		copy(at, f.code)
		for off, callee := range f.calls {
			next := addr[f.name] + uint64(off) + 4
			binary.LittleEndian.PutUint32(at[off:], uint32(int32(addr[callee]-next)))
		}
		fmt.Fprintf(&syms, "%x T %s\n", addr[f.name], f.name)
	}
	return text, syms.String()
}

// Addr is the address of a function of the test kernel plus off.
func Addr(name string, off uint64) uint64 {
	for i, f := range functions {
		if f.name == name {
			return TextAddr + uint64(i*funcSize) + off
		}
	}
	panic("kerninstdtest: no function " + name)
}
