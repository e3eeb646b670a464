package splice

import "testing"

func TestParsePoint(t *testing.T) {
	for _, tc := range []struct {
		in       string
		mod      string
		fn       string
		off      uint64
		hasOff   bool
		classic  bool
		bad      bool
		block    int
		hasBlock bool
	}{
		{in: "filename_lookup", fn: "filename_lookup"},
		{in: "lookuppn", fn: "filename_lookup", classic: true},
		{in: "mutex_enter", fn: "mutex_lock", classic: true},
		{in: "vfs_read+0x1a", fn: "vfs_read", off: 0x1a, hasOff: true},
		{in: "vfs_read+16", fn: "vfs_read", off: 16, hasOff: true},
		{in: "vfs_read+", bad: true},
		{in: "+0x10", bad: true},
		{in: "a b", bad: true},
		{in: "vfs_read:3", fn: "vfs_read", block: 3, hasBlock: true},
		{in: "lookuppn:0", fn: "filename_lookup", hasBlock: true, classic: true},
		{in: "vfs_read:", bad: true},
		{in: "vfs_read:-1", bad: true},
		{in: "vfs_read:0x3", bad: true},
		{in: "vfs_read:1+2", bad: true},
		{in: "kinst_leak:leak_thread", mod: "kinst_leak", fn: "leak_thread"},
		{in: "kinst_leak:leak_thread+0x51", mod: "kinst_leak", fn: "leak_thread", off: 0x51, hasOff: true},
		{in: "evdev:evdev_read:2", mod: "evdev", fn: "evdev_read", block: 2, hasBlock: true},
		{in: "mod:lookuppn", mod: "mod", fn: "lookuppn"}, // a module's own, not the classic name
		{in: ":vfs_read", bad: true},
		{in: "a/b:vfs_read", bad: true},
	} {
		p, err := ParsePoint(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParsePoint(%q) = %+v, want error", tc.in, p)
			}
			continue
		}
		if err != nil || p.Module != tc.mod || p.Function != tc.fn || p.Offset != tc.off || p.HasOffset != tc.hasOff || (p.Classic != nil) != tc.classic ||
			p.Block != tc.block || p.HasBlock != tc.hasBlock {
			t.Errorf("ParsePoint(%q) = %+v, %v", tc.in, p, err)
		}
	}
	for _, n := range ClassicNames() {
		if Classic[n].Linux == "" || Classic[n].Why == "" {
			t.Errorf("classic %s has no mapping or reason", n)
		}
	}
}
