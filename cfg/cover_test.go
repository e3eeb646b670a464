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

// TestCoverRunIntoPadding: runs that end in a ret or jmp short of a jmp's
// 5 bytes continue into the nops after them (testdata shapes of
// process/testdata/padret.c), and only there; PaddingAfter counts those
// nops after a block's final ret or jmp, and none elsewhere.
func TestCoverRunIntoPadding(t *testing.T) {
	code := []byte{
		0x48, 0x89, 0xf8, // +0x0 mov %rdi,%rax
		0x53,                   // +0x3 push %rbx
		0x40, 0xf6, 0xc7, 0x01, // +0x4 test $1,%dil
		0x75, 0x05, // +0x8 jne +0xf
		0x5b,             // +0xa pop %rbx
		0xc3,             // +0xb ret
		0x0f, 0x1f, 0x00, // +0xc nopl (%rax): padding
		0x48, 0x83, 0xc0, 0x01, // +0xf add $1,%rax
		0x40, 0xf6, 0xc7, 0x02, // +0x13 test $2,%dil
		0x75, 0x05, // +0x17 jne +0x1e
		0xc3,                   // +0x19 ret
		0x0f, 0x1f, 0x40, 0x00, // +0x1a nopl 0x0(%rax): padding
		0x40, 0xf6, 0xc7, 0x04, // +0x1e test $4,%dil
		0x75, 0x04, // +0x22 jne +0x28
		0xeb, 0x03, // +0x24 jmp +0x29
		0xcc,                   // +0x26 int3: padding, not a nop
		0xcc,                   // +0x27
		0x90,                   // +0x28 nop: a jump target
		0x48, 0x83, 0xc0, 0x10, // +0x29 add $16,%rax
		0xc3, // +0x2d ret: nothing after it
	}
	fn, err := Decode("padret", "", 0x1000, code)
	if err != nil {
		t.Fatal(err)
	}
	blocks := fn.Blocks(nil)
	all := func(int, bool) bool { return true }
	idx := func(off uint64) int {
		i, err := fn.Index(0x1000 + off)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	for _, tc := range []struct {
		name   string
		off    uint64
		usable func(j int, last bool) bool
		n, pad int
		ok     bool
	}{
		{"pop+ret, 3 bytes of nop", 0xa, all, 2, 3, true},
		{"ret alone, 4 bytes of nop", 0x19, all, 1, 4, true},
		{"ret refused", 0xa, func(j int, _ bool) bool { return j != idx(0xb) }, 0, 0, false},
		{"pop must fall through", 0xa, func(j int, last bool) bool { return last || j != idx(0xa) }, 0, 0, false},
		{"jmp before int3s: not nops", 0x24, all, 0, 0, false},
		{"ret with nothing after", 0x2d, all, 0, 0, false},
		{"long enough within the block", 0xf, all, 0, 0, false},
		{"test+jne: ends in a jcc", 0x13, all, 0, 0, false},
	} {
		b := BlockOf(blocks, idx(tc.off))
		n, pad, ok := CoverRunIntoPadding(fn, blocks, b, idx(tc.off), 5, tc.usable)
		if n != tc.n || pad != tc.pad || ok != tc.ok {
			t.Errorf("%s: %d, %d, %v; want %d, %d, %v", tc.name, n, pad, ok, tc.n, tc.pad, tc.ok)
		}
	}
	for _, tc := range []struct {
		off  uint64
		want int
	}{{0xb, 3}, {0x19, 4}, {0xa, 0}, {0x24, 0}, {0x2d, 0}, {0x17, 0}} {
		if got := PaddingAfter(fn, blocks, idx(tc.off)); got != tc.want {
			t.Errorf("PaddingAfter(+%#x) = %d, want %d", tc.off, got, tc.want)
		}
	}
}

// CoverRunIntoNext: a block entered only by falling through from a jcc
// (argz_create's "jne; jmp" in libc) is covered by a run that starts in
// the block before it; a block a branch lands on, or one with two ways
// in, is not.
func TestCoverRunIntoNext(t *testing.T) {
	code := []byte{
		0x48, 0x85, 0xff, // +0x0 test %rdi,%rdi  block 0
		0x74, 0x07, // +0x3 je +0xc
		0x48, 0x85, 0xf6, // +0x5 test %rsi,%rsi  block 1: falls from block 0 only
		0x75, 0xf6, // +0x8 jne +0x0
		0xeb, 0x04, // +0xa jmp +0x10  block 2: falls from block 1 only
		0x31, 0xc0, // +0xc xor %eax,%eax  block 3: je's target
		0xeb, 0x00, // +0xe jmp +0x10
		0xc3, // +0x10 ret  block 4: two jumps land here
	}
	fn, err := Decode("f", "", 0x1000, code)
	if err != nil {
		t.Fatal(err)
	}
	blocks := fn.Blocks(nil)
	if len(blocks) != 5 {
		t.Fatalf("%d blocks, want 5", len(blocks))
	}
	all := func(int, bool) bool { return true }
	for _, tc := range []struct {
		name   string
		b, i   int
		usable func(j int, last bool) bool
		n      int
		ok     bool
	}{
		{"test+jne+jmp into block 2", 2, 2, all, 3, true},
		{"jne+jmp: 4 bytes, and block 2 ends", 2, 3, all, 0, false},
		{"je+test into block 1", 1, 1, all, 2, true},
		{"test+je reach 5 bytes before block 1: its first instruction too", 1, 0, all, 3, true},
		{"block 3: a branch lands on it", 3, 1, all, 0, false},
		{"block 4: two ways in", 4, 6, all, 0, false},
		{"the jne may not fall through", 2, 2, func(j int, last bool) bool { return last || j != 3 }, 0, false},
		{"block 2's jmp refused", 2, 2, func(j int, _ bool) bool { return j != 4 }, 0, false},
		{"i outside the block before", 2, 1, all, 0, false},
		{"the entry block has none before", 0, 0, all, 0, false},
	} {
		n, ok := CoverRunIntoNext(fn, blocks, tc.b, tc.i, 5, tc.usable)
		if n != tc.n || ok != tc.ok {
			t.Errorf("%s: %d, %v; want %d, %v", tc.name, n, ok, tc.n, tc.ok)
		}
	}
}
