package cfg

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// ifElse: an if/else that joins, then a call and a return.
var ifElse = []byte{
	0x53,       // i0 0x00 push %rbx
	0x85, 0xff, // i1 0x01 test %edi,%edi
	0x74, 0x07, // i2 0x03 je 0x0c
	0xb8, 0x01, 0x00, 0x00, 0x00, // i3 0x05 mov $1,%eax
	0xeb, 0x05, // i4 0x0a jmp 0x11
	0xb8, 0x02, 0x00, 0x00, 0x00, // i5 0x0c mov $2,%eax
	0x83, 0xc0, 0x03, // i6 0x11 add $3,%eax
	0xe8, 0x00, 0x00, 0x00, 0x00, // i7 0x14 call (next)
	0x5b, // i8 0x19 pop %rbx
	0xc3, // i9 0x1a ret
}

// twoTests: two early-outs to one return.
var twoTests = []byte{
	0x85, 0xff, // m0 0x00 test %edi,%edi
	0x74, 0x06, // m1 0x02 je 0x0a
	0x85, 0xf6, // m2 0x04 test %esi,%esi
	0x74, 0x02, // m3 0x06 je 0x0a
	0x31, 0xc0, // m4 0x08 xor %eax,%eax
	0xc3, // m5 0x0a ret
}

// condCall: a call the branch before it may skip.
var condCall = []byte{
	0x85, 0xff, // c0 0x00 test %edi,%edi
	0x74, 0x05, // c1 0x02 je 0x09
	0xe8, 0x00, 0x00, 0x00, 0x00, // c2 0x04 call (next)
	0x31, 0xc0, // c3 0x09 xor %eax,%eax
	0xc3, // c4 0x0b ret
}

// coldLoop: a .cold part whose loop the hot part jumps into (the entry
// only returns): while (!stop()) sleep(200);
var coldLoop = []byte{
	0xc3,                         // k0 0x00 ret
	0xe8, 0x00, 0x00, 0x00, 0x00, // k1 0x01 call (stop)
	0x85, 0xc0, // k2 0x06 test %eax,%eax
	0x75, 0x0c, // k3 0x08 jne 0x16
	0xbf, 0xc8, 0x00, 0x00, 0x00, // k4 0x0a mov $200,%edi
	0xe8, 0x00, 0x00, 0x00, 0x00, // k5 0x0f call (sleep)
	0xeb, 0xeb, // k6 0x14 jmp 0x01
	0xe9, 0x00, 0x01, 0x00, 0x00, // k7 0x16 jmp back to the hot part
}

// toCold: a branch out of the function (to a .cold part).
var toCold = []byte{
	0x85, 0xff, // 0x00 test %edi,%edi
	0x0f, 0x84, 0x00, 0x01, 0x00, 0x00, // 0x02 je +0x100
	0xc3, // 0x08 ret
}

func TestRegion(t *testing.T) {
	for _, c := range []struct {
		name string
		code []byte
		in   []int
		want string // sites as index:E/X, exit-first ones as index:XE; or "error: …"
	}{
		{"then branch, its jmp to a shared join left out", ifElse, []int{3, 4}, "3:CE 4:X"},
		{"the join to the return", ifElse, []int{6, 7, 8, 9}, "6:CE 9:X"},
		{"the whole function", ifElse, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, "0:CE 9:X"},
		{"test and branch: left at both arms", ifElse, []int{1, 2}, "1:CE 3:X 5:X"},
		{"branch and then-start", ifElse, []int{2, 3}, "2:CE 4:X 5:X"},
		{"else and join: the else arm's one instruction left out", ifElse, []int{5, 6}, "6:CE 7:X"},
		{"all but the then arm, an island: no second call", ifElse, []int{0, 1, 2, 5, 6}, "0:CE 3:X 5:X 6:E 7:X"},
		{"left from the call's successor", ifElse, []int{6, 7}, "6:CE 8:X"},
		{"a conditional call: the branch timed with it, the call counted", condCall, []int{2}, "1:E 2:C 3:X"},
		{"a branch that stays and leaves to a shared target: the other branch timed", twoTests, []int{2, 3, 4}, "1:E 2:C 5:X"},
		{"entered from inside and by a branch", twoTests, []int{3, 4, 5}, "1:E 2:X 3:CE 5:X"},
		{"a .cold part's loop, entered from the hot part: each pass a call", coldLoop, []int{4, 5}, "4:CE 6:X"},
		{"only an arm's last instruction", twoTests, []int{1}, "error: each of the range's instructions"},
		{"a branch out of the function", toCold, []int{0, 1, 2}, "error: code timed with the range branches out of f to 0x108"},
		{"nothing", twoTests, nil, "error: no instruction"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f, err := Decode("f", "", 0, c.code)
			if err != nil {
				t.Fatal(err)
			}
			in := map[int]bool{}
			for _, i := range c.in {
				in[i] = true
			}
			sites, err := Region(f, f.Blocks(nil), func(i int) bool { return in[i] })
			var got string
			if err != nil {
				var re *RegionError
				if !errors.As(err, &re) {
					t.Fatalf("error %v is not a *RegionError", err)
				}
				got = "error: " + re.Why
			} else {
				var parts []string
				for _, s := range sites {
					p := fmt.Sprint(s.Index, ":")
					if s.Count {
						p += "C"
					}
					if s.Enter {
						p += "E"
					}
					if s.Exit {
						p += "X"
					}
					parts = append(parts, p)
				}
				got = strings.Join(parts, " ")
			}
			if !strings.HasPrefix(got, c.want) {
				t.Errorf("sites %q, want %q", got, c.want)
			}
		})
	}
}
