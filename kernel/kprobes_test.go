package kernel

import (
	"strings"
	"testing"
)

func TestParseKprobeBlacklist(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     []uint64
		err      string
	}{
		{"kernel and module", "0xffffffff81001000-0xffffffff81001020\tnotify_die\n0xffffffffc0010000-0xffffffffc0010040\tfoo [bar]\n",
			[]uint64{0xffffffff81001000, 0xffffffffc0010000}, ""},
		{"empty", "", nil, ""},
		{"hidden addresses", "0x0000000000000000-0x0000000000000000\tnotify_die\n0x0000000000000000-0x0000000000000000\tdo_int3\n", nil, "hidden"},
		{"garbage", "notify_die\n", nil, "START-END"},
		{"bad hex", "0xzz-0x10\tf\n", nil, "invalid syntax"},
	} {
		bl, err := ParseKprobeBlacklist(strings.NewReader(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(bl) != len(c.want) {
			t.Errorf("%s: %d entries, want %d", c.name, len(bl), len(c.want))
		}
		for _, a := range c.want {
			if !bl[a] {
				t.Errorf("%s: %#x missing", c.name, a)
			}
		}
	}
}
