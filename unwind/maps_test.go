package unwind

import (
	"strings"
	"testing"
)

func TestParseMaps(t *testing.T) {
	in := `55d0c8a00000-55d0c8a02000 r--p 00000000 fe:00 247026                     /usr/bin/cat
55d0c8a02000-55d0c8a07000 r-xp 00002000 fe:00 247026                     /usr/bin/cat
7f00aa000000-7f00aa021000 rw-p 00000000 00:00 0 
7f00ab000000-7f00ab001000 r-xp 00000000 08:01 42                         /tmp/a dir/lib x.so (deleted)
7ffd1e5f7000-7ffd1e618000 rw-p 00000000 00:00 0                          [stack]
`
	maps, err := ParseMaps(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []Mapping{
		{0x55d0c8a00000, 0x55d0c8a02000, 0, "r--p", 247026, "/usr/bin/cat"},
		{0x55d0c8a02000, 0x55d0c8a07000, 0x2000, "r-xp", 247026, "/usr/bin/cat"},
		{0x7f00aa000000, 0x7f00aa021000, 0, "rw-p", 0, ""},
		{0x7f00ab000000, 0x7f00ab001000, 0, "r-xp", 42, "/tmp/a dir/lib x.so (deleted)"},
		{0x7ffd1e5f7000, 0x7ffd1e618000, 0, "rw-p", 0, "[stack]"},
	}
	if len(maps) != len(want) {
		t.Fatalf("%d mappings, want %d", len(maps), len(want))
	}
	for i := range want {
		if maps[i] != want[i] {
			t.Errorf("mapping %d: %+v, want %+v", i, maps[i], want[i])
		}
	}
	if _, err := ParseMaps(strings.NewReader("zz-10 r-xp 0 0:0 1 /x\n")); err == nil {
		t.Error("a bad address parsed")
	}
}
