package report

import (
	"slices"
	"testing"

	"github.com/kinst/kinst/kernel"
)

func TestFindFunctions(t *testing.T) {
	syms := kernel.NewSymbols([]kernel.Symbol{
		{Addr: 0x1000, Type: 'T', Name: "filename_lookup"},
		{Addr: 0x2000, Type: 't', Name: "do_filename_lookup_slow"},
		{Addr: 0x3000, Type: 'T', Name: "vfs_read"},
		{Addr: 0x4000, Type: 't', Name: "evdev_read", Module: "evdev"},
		{Addr: 0x5000, Type: 'D', Name: "lookup_data"}, // not a function
	})
	for _, tc := range []struct {
		q     string
		limit int
		want  []string
		total int
	}{
		{"lookup", 10, []string{"lookuppn", "filename_lookup", "do_filename_lookup_slow"}, 3},
		{"LOOKUP", 1, []string{"lookuppn"}, 3},
		{"read", 10, []string{"vfs_read", "evdev_read"}, 2},
		{"vfs_", 10, []string{"vfs_read"}, 1},
		{"nothing", 10, nil, 0},
		{"lookup", 0, nil, 3},
		{"lookup", -1, nil, 3},
		{"", 10, []string{"lookuppn"}, 1},
		{"*_read", 10, []string{"vfs_read", "evdev_read"}, 2},
		{"evdev:", 10, []string{"evdev_read"}, 1},
		{"evdev:*read", 10, []string{"evdev_read"}, 1},
		{"evdev:lookup", 10, nil, 0},
		{"nomodule:", 10, nil, 0},
	} {
		got := FindFunctions(syms, tc.q, tc.limit, FindOptions{Classic: true})
		var names []string
		for _, f := range got.Functions {
			names = append(names, f.Name)
		}
		if !slices.Equal(names, tc.want) || got.Total != tc.total {
			t.Errorf("%q limit %d: %v (total %d), want %v (total %d)", tc.q, tc.limit, names, got.Total, tc.want, tc.total)
		}
	}
	got := FindFunctions(syms, "lookuppn", 5, FindOptions{Classic: true})
	if len(got.Functions) != 1 || got.Functions[0].Classic == nil || got.Functions[0].Classic.Linux != "filename_lookup" || got.Functions[0].Address != 0x1000 {
		t.Errorf("classic name: %+v", got.Functions)
	}
	if got := FindFunctions(syms, "evdev_read", 5, FindOptions{Classic: true}); got.Functions[0].Module != "evdev" {
		t.Errorf("module function: %+v", got.Functions)
	}
}
