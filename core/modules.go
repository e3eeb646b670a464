package core

import (
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
			t, _ = orc.Parse(ips, ip, ents)
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
	// textEnd is _etext: the kernel's table has no entries past it (its
	// last row would otherwise cover all the kernel half above); 0 where
	// unknown.
	textEnd uint64
}

func (f orcFinder) Lookup(ip uint64) (orc.Entry, bool) {
	if m := f.k.ModuleAt(ip); m != nil {
		t := f.k.moduleORC(m)
		if t == nil {
			return orc.Entry{}, false
		}
		return t.Lookup(ip)
	}
	if f.textEnd != 0 && ip >= f.textEnd {
		return orc.Entry{}, false
	}
	return f.kernel.Lookup(ip)
}
