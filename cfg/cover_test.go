package cfg

import "testing"

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
		n, ok := 0, false
		if b := BlockOf(blocks, tc.i); b != nil {
			n, ok = CoverRun(fn, b, tc.i, 5, tc.usable)
		}
		if n != tc.n || ok != tc.ok {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, n, ok, tc.n, tc.ok)
		}
	}
	long, _ := Decode("g", "", 0x2000, []byte{0xb8, 1, 0, 0, 0, 0xc3}) // mov $1,%eax; ret
	if _, ok := CoverRun(long, &long.Blocks(nil)[0], 0, 5, all); ok {
		t.Error("a 5-byte instruction needs no covering run")
	}
	if HasUnresolvedJump(blocks) {
		t.Error("an unresolved jump in a function without indirect jumps")
	}
	jmp, _ := Decode("h", "", 0x3000, []byte{0xff, 0xe0, 0xc3}) // jmp *%rax; ret
	if !HasUnresolvedJump(jmp.Blocks(nil)) {
		t.Error("jmp *%rax not reported")
	}
}

func TestBlockOf(t *testing.T) {
	blocks := []Block{{First: 0, N: 2}, {First: 2, N: 3, Padding: true}, {First: 5, N: 1}}
	for i, want := range []int{0, 0, 1, 1, 1, 2, -1, -1} {
		got := -1
		if b := BlockOf(blocks, i); b != nil {
			for k := range blocks {
				if &blocks[k] == b {
					got = k
				}
			}
		}
		if got != want {
			t.Errorf("instruction %d: block %d, want %d", i, got, want)
		}
	}
}
