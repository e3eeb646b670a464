package core

import (
	"slices"

	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/unwind/orc"
)

// moduleORC returns a module's ORC table (struct mod_arch_specific, read
// by the kernel view's module walk), parsed on first use; nil without
// one.
func (k *Kernel) moduleORC(m *kernel.Module) *orc.Table {
	k.modMu.Lock()
	defer k.modMu.Unlock()
	if t, ok := k.modORC[m.Addr]; ok {
		return t
	}
	var t *orc.Table
	if n, ip, un := m.ORC.Count, m.ORC.IP, m.ORC.Unwind; n > 0 && n < maxORC/orc.EntrySize && ip != 0 && un != 0 {
		ips, err1 := k.ReadBytes(ip, int(n*4))
		ents, err2 := k.ReadBytes(un, int(n*orc.EntrySize))
		if err1 == nil && err2 == nil {
			t, _ = orc.ParseFormat(ips, ip, ents, k.orcFormat())
		}
	}
	k.modORC[m.Addr] = t
	return t
}

// orcFinder looks an address up in its module's ORC table, else the
// kernel's.
type orcFinder struct {
	k      *Kernel
	kernel *orc.Table
	// text is where the kernel's table applies: its last row would
	// otherwise cover all the kernel half above it. Empty where the
	// symbols do not say.
	text []textRange
}

// textRange is a range [start, end) of the kernel image's text.
type textRange struct{ start, end uint64 }

// kernelText is the kernel image's text that ORC covers: [_text, _etext)
// and the init text [_sinittext, _einittext), where start_kernel and the
// boot CPU's idle task's outer frames live; nil when a bound is missing.
func kernelText(s interface{ Address(string) (uint64, bool) }) []textRange {
	var out []textRange
	for _, r := range [][2]string{{"_text", "_etext"}, {"_sinittext", "_einittext"}} {
		a, ok1 := s.Address(r[0])
		b, ok2 := s.Address(r[1])
		if !ok1 || !ok2 || b <= a {
			return nil
		}
		out = append(out, textRange{a, b})
	}
	return out
}

func (f orcFinder) Lookup(ip uint64) (orc.Entry, bool) {
	if m := f.k.ModuleAt(ip); m != nil {
		t := f.k.moduleORC(m)
		if t == nil {
			return orc.Entry{}, false
		}
		return t.Lookup(ip)
	}
	if f.text != nil && !slices.ContainsFunc(f.text, func(r textRange) bool { return ip >= r.start && ip < r.end }) {
		return orc.Entry{}, false
	}
	return f.kernel.Lookup(ip)
}
