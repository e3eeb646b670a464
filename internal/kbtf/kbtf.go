// Package kbtf holds the small BTF look-ups that both the live-kernel
// analysis (cfg) and the postmortem kernel view (core) need.
package kbtf

import "github.com/cilium/ebpf/btf"

// Member finds the member called name in a struct or union, looking
// through anonymous members as C does. The returned member's Offset is
// from the start of typ, not of the anonymous member that holds it.
func Member(typ btf.Type, name string) (btf.Member, bool) {
	var members []btf.Member
	switch c := btf.UnderlyingType(typ).(type) {
	case *btf.Struct:
		members = c.Members
	case *btf.Union:
		members = c.Members
	default:
		return btf.Member{}, false
	}
	for _, m := range members {
		if m.Name == name {
			return m, true
		}
	}
	for _, m := range members {
		if m.Name == "" {
			if inner, ok := Member(m.Type, name); ok {
				inner.Offset += m.Offset
				return inner, true
			}
		}
	}
	return btf.Member{}, false
}
