package splice

import (
	"fmt"
	"testing"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/springboard"
)

func TestSpringboardSpace(t *testing.T) {
	const at = 0xffffffff81000000
	cases := []struct {
		name  string
		code  []byte
		owned uint64
		want  []springboard.Range
	}{
		{
			name: "nops after ret thunk jmp and int3",
			code: []byte{
				0x48, 0x85, 0xc0, // test %rax,%rax
				0x74, 0x01, // je +1
				0x90,                         // nop (reachable: fallthrough)
				0xe9, 0x00, 0x10, 0x00, 0x00, // +6 jmp (tail)
				0xcc,                                     // +b int3 (SLS)
				0x66, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0, // +c nopw 0x0(%rax,%rax,1)
				0x0f, 0x1f, 0x40, 0x00, // +15 nopl 0x0(%rax)
			},
			want: []springboard.Range{{Start: at + 0xb, End: at + 0x19}},
		},
		{
			name: "not after a call",
			code: []byte{0xe8, 0, 0, 0, 0, 0x0f, 0x1f, 0x44, 0, 0, 0xc3},
		},
		{
			name: "not after ud2 (WARN continues)",
			code: []byte{0x0f, 0x0b, 0x0f, 0x1f, 0x44, 0, 0, 0xc3},
		},
		{
			name:  "not after a static-key jmp",
			code:  []byte{0xe9, 0x07, 0, 0, 0, 0x0f, 0x1f, 0x44, 0, 0, 0xcc, 0xcc, 0xc3},
			owned: at,
		},
		{
			name: "after ret",
			code: []byte{0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc},
			want: []springboard.Range{{Start: at + 1, End: at + 7}},
		},
		{
			name: "nothing in a function with an unresolved indirect jump",
			code: []byte{0xff, 0xe0, 0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc},
		},
	}
	for _, c := range cases {
		fn, err := cfg.Decode("f", "", at, c.code)
		if err != nil {
			t.Fatal(err)
		}
		owned := func(a uint64) bool { return c.owned != 0 && a == c.owned }
		got := SpringboardSpace(fn, fn.Blocks(nil), owned)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%s: %x, want %x", c.name, got, c.want)
		}
	}
}
