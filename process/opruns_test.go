package process

import (
	"fmt"
	"strings"
	"testing"
)

// opRuns: ops less than a page apart share a run, in address order
// whatever the order given; farther ones, overlapping ones and a run
// grown past runMax start a new one; each run's buffer spans its ops.
func TestOpRuns(t *testing.T) {
	op := func(addr uint64, n int) spliced {
		return spliced{addr: addr, orig: make([]byte, n), new: make([]byte, n)}
	}
	for _, c := range []struct {
		name string
		ops  []spliced
		want string // runs as addr+len[ops]
	}{
		{"one", []spliced{op(0x1000, 5)}, "0x1000+5[1]"},
		{"close, out of order", []spliced{op(0x1100, 5), op(0x1000, 5), op(0x1050, 1)}, "0x1000+261[3]"},
		{"a page apart", []spliced{op(0x1000, 5), op(0x1005+runGap, 5)}, "0x1000+5[1] 0x2005+5[1]"},
		{"just under a page apart", []spliced{op(0x1000, 5), op(0x1005+runGap-1, 5)}, "0x1000+4105[2]"},
		{"overlapping", []spliced{op(0x1000, 5), op(0x1002, 5)}, "0x1000+5[1] 0x1002+5[1]"},
		{"past runMax", []spliced{op(0x1000, 5), op(0x1000+runMax-3, 5)}, fmt.Sprintf("0x1000+5[1] %#x+5[1]", 0x1000+runMax-3)},
	} {
		var got []string
		for _, r := range opRuns(c.ops) {
			got = append(got, fmt.Sprintf("%#x+%d[%d]", r.addr, len(r.buf), len(r.ops)))
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("%s: %s, want %s", c.name, g, c.want)
		}
	}
}
