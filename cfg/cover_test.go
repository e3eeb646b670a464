package cfg

import (
	"strings"
	"testing"

	"github.com/kinst/kinst/kernel"
)

func TestCoverRun(t *testing.T) {
	code := []byte{
		0x55,             // +0x0 push %rbp
		0x48, 0x89, 0xe5, // +0x1 mov %rsp,%rbp
		0x41, 0x54, // +0x4 push %r12
		0x48, 0x85, 0xff, // +0x6 test %rdi,%rdi
		0x74, 0x03, // +0x9 je +0xe
		0x31, 0xc0, // +0xb xor %eax,%eax
		0xc3,       // +0xd ret
		0x5d,       // +0xe pop %rbp  (a jump target: its own block)
		0x41, 0x5c, // +0xf pop %r12
		0xc3, // +0x11 ret
	}
	fn, err := Decode("f", "", 0x1000, code)
	if err != nil {
		t.Fatal(err)
	}
	blocks := fn.Blocks(nil)
	all := func(int, bool) bool { return true }
	for _, tc := range []struct {
		name   string
		i      int
		usable func(j int, last bool) bool
		n      int
		ok     bool
	}{
		{"push+mov+push", 0, all, 3, true},
		{"mov+push", 1, all, 2, true},
		{"test+je", 3, all, 2, true},
		{"xor+ret: 3 bytes left in the block", 5, all, 0, false},
		{"pop: the block ends before 5 bytes", 7, all, 0, false},
		{"refused second instruction", 0, func(j int, _ bool) bool { return j != 1 }, 0, false},
		{"a branch only last", 0, func(j int, last bool) bool { return last || j != 1 }, 0, false},
		{"out of range", 99, all, 0, false},
	} {
		n, ok := CoverRun(fn, blocks, tc.i, 5, nil, nil, tc.usable)
		if n != tc.n || ok != tc.ok {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, n, ok, tc.n, tc.ok)
		}
	}
	// A symbol after the first instruction is a way in: no run over it;
	// one at the first instruction is not in the way.
	syms, err := kernel.ParseKallsyms(strings.NewReader("0000000000001000 t f\n0000000000001001 t f_inner\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := CoverRun(fn, blocks, 0, 5, syms, nil, all); ok {
		t.Error("a run over a symbol's start")
	}
	if n, ok := CoverRun(fn, blocks, 1, 5, syms, nil, all); n != 2 || !ok {
		t.Errorf("from the symbol itself: %d, %v; want 2, true", n, ok)
	}
	long, _ := Decode("g", "", 0x2000, []byte{0xb8, 1, 0, 0, 0, 0xc3}) // mov $1,%eax; ret
	if _, ok := CoverRun(long, long.Blocks(nil), 0, 5, nil, nil, all); ok {
		t.Error("a 5-byte instruction needs no covering run")
	}
}
