package core

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kinst/kinst/unwind/orc"
)

// Module is a loaded kernel module as the dump holds it: its core
// (non-init) memory, the symbols the kernel kept for it (mod->kallsyms)
// and its ORC table (mod->arch).
//
// Kernel-version caveat: the layout read is 6.1's (module.core_layout,
// module.arch.orc_*); 6.4 replaced core_layout with mem[], which this
// reader does not follow yet (Modules then returns an error and stacks
// end at module frames).
type Module struct {
	Name     string
	Addr     uint64 // struct module
	Base     uint64
	Size     uint64
	TextSize uint64
	syms     []Symbol // sorted by address
	orc      *orc.Table
}

// Contains reports whether addr is in the module's core memory.
func (m *Module) Contains(addr uint64) bool { return addr >= m.Base && addr-m.Base < m.Size }

// maxModules, maxModSyms bound reads through a corrupt dump.
const (
	maxModules = 1 << 14
	maxModSyms = 1 << 20
	elfSymSize = 24 // Elf64_Sym
)

type moduleLayout struct {
	list, name, base, size, textSize, numOrcs, orcIP, orcUnwind, kallsyms uint64
	symtab, numSymtab, strtab, typetab                                    uint64 // in mod_kallsyms
	nameLen                                                               uint64
}

// Modules lists the loaded modules (the "modules" list), once.
func (k *Kernel) Modules() ([]*Module, error) {
	return k.mods.get("modules", k.loadModules)
}

func (k *Kernel) loadModules() ([]*Module, error) {
	t, err := k.Types()
	if err != nil {
		return nil, err
	}
	var l moduleLayout
	var errs []error
	off := func(dst *uint64, st, path string) {
		o, err := t.Offset(st, path)
		errs = append(errs, err)
		*dst = o
	}
	off(&l.list, "module", "list")
	off(&l.name, "module", "name")
	off(&l.base, "module", "core_layout.base")
	off(&l.size, "module", "core_layout.size")
	off(&l.textSize, "module", "core_layout.text_size")
	off(&l.numOrcs, "module", "arch.num_orcs")
	off(&l.orcIP, "module", "arch.orc_unwind_ip")
	off(&l.orcUnwind, "module", "arch.orc_unwind")
	off(&l.kallsyms, "module", "kallsyms")
	off(&l.symtab, "mod_kallsyms", "symtab")
	off(&l.numSymtab, "mod_kallsyms", "num_symtab")
	off(&l.strtab, "mod_kallsyms", "strtab")
	off(&l.typetab, "mod_kallsyms", "typetab")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	l.nameLen, _ = t.MemberSize("module", "name")
	if l.nameLen == 0 || l.nameLen > 256 {
		l.nameLen = 56
	}
	syms, err := k.Symbols()
	if err != nil {
		return nil, err
	}
	head, err := syms.Addr("modules")
	if err != nil {
		return nil, err
	}
	var mods []*Module
	n := 0
	err = k.walkList(head, l.list, func(addr uint64) error {
		if n++; n > maxModules {
			return fmt.Errorf("more than %d modules", maxModules)
		}
		m, err := k.readModule(&l, addr)
		if err != nil {
			return err
		}
		mods = append(mods, m)
		return nil
	})
	sort.Slice(mods, func(i, j int) bool { return mods[i].Base < mods[j].Base })
	return mods, err
}

func (k *Kernel) readModule(l *moduleLayout, addr uint64) (*Module, error) {
	name, err := k.ReadBytes(addr+l.name, int(l.nameLen))
	if err != nil {
		return nil, fmt.Errorf("module at %#x: %w", addr, err)
	}
	if i := bytes.IndexByte(name, 0); i >= 0 {
		name = name[:i]
	}
	m := &Module{Name: string(name), Addr: addr}
	u32 := func(a uint64) uint64 { v, _ := k.ReadU32(a); return uint64(v) }
	u64 := func(a uint64) uint64 { v, _ := k.ReadU64(a); return v }
	m.Base, m.Size, m.TextSize = u64(addr+l.base), u32(addr+l.size), u32(addr+l.textSize)
	if n, ip, un := u32(addr+l.numOrcs), u64(addr+l.orcIP), u64(addr+l.orcUnwind); n > 0 && n < maxORC/orc.EntrySize && ip != 0 && un != 0 {
		ips, err1 := k.ReadBytes(ip, int(n*4))
		ents, err2 := k.ReadBytes(un, int(n*orc.EntrySize))
		if errors.Join(err1, err2) == nil {
			m.orc, _ = orc.Parse(ips, ip, ents)
		}
	}
	ks := u64(addr + l.kallsyms)
	if ks == 0 {
		return m, nil
	}
	num, symtab, strtab, typetab := u32(ks+l.numSymtab), u64(ks+l.symtab), u64(ks+l.strtab), u64(ks+l.typetab)
	if num == 0 || num > maxModSyms || symtab == 0 || strtab == 0 || typetab == 0 {
		return m, nil
	}
	st, err1 := k.ReadBytes(symtab, int(num*elfSymSize))
	types, err2 := k.ReadBytes(typetab, int(num))
	if err := errors.Join(err1, err2); err != nil {
		return m, nil // symbols unreadable: the module still bounds addresses
	}
	maxName := uint64(0)
	for i := uint64(0); i < num; i++ {
		maxName = max(maxName, uint64(binary.LittleEndian.Uint32(st[i*elfSymSize:])))
	}
	strs, err := k.readUpTo(strtab, int(maxName)+256)
	if err != nil {
		return m, nil
	}
	for i := uint64(0); i < num; i++ {
		e := st[i*elfSymSize:]
		nameOff := uint64(binary.LittleEndian.Uint32(e))
		shndx := binary.LittleEndian.Uint16(e[6:])
		value := binary.LittleEndian.Uint64(e[8:])
		if shndx == 0 || nameOff >= uint64(len(strs)) || !m.Contains(value) {
			continue
		}
		nm := strs[nameOff:]
		if j := bytes.IndexByte(nm, 0); j >= 0 {
			nm = nm[:j]
		}
		if len(nm) == 0 {
			continue
		}
		m.syms = append(m.syms, Symbol{Addr: value, Type: types[i], Name: string(nm), Module: m.Name})
	}
	sort.SliceStable(m.syms, func(i, j int) bool { return m.syms[i].Addr < m.syms[j].Addr })
	return m, nil
}

// readUpTo reads up to n bytes, stopping early at an unmapped page.
func (k *Kernel) readUpTo(va uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	done := 0
	for done < n {
		chunk := min(n-done, int(pageSize-(va+uint64(done))&pageMask))
		if err := k.ReadVirt(b[done:done+chunk], va+uint64(done)); err != nil {
			if done == 0 {
				return nil, err
			}
			break
		}
		done += chunk
	}
	return b[:done], nil
}

// module returns the module whose core memory holds addr.
func (k *Kernel) module(addr uint64) *Module {
	if addr < k.imageEnd && addr >= startKernelMap {
		return nil
	}
	mods, _ := k.Modules()
	i := sort.Search(len(mods), func(i int) bool { return mods[i].Base+mods[i].Size > addr })
	if i < len(mods) && mods[i].Contains(addr) {
		return mods[i]
	}
	return nil
}

// SymbolAt names the kernel or module symbol containing addr.
func (k *Kernel) SymbolAt(addr uint64) (Symbol, uint64, bool) {
	if m := k.module(addr); m != nil {
		i := sort.Search(len(m.syms), func(i int) bool { return m.syms[i].Addr > addr })
		if i == 0 {
			return Symbol{}, 0, false
		}
		return m.syms[i-1], addr - m.syms[i-1].Addr, true
	}
	syms, err := k.Symbols()
	if err != nil {
		return Symbol{}, 0, false
	}
	return syms.At(addr)
}

// SymbolSize is the distance from sym to the next symbol (0 if none).
func (k *Kernel) SymbolSize(sym Symbol) uint64 {
	if sym.Module == "" {
		syms, err := k.Symbols()
		if err != nil {
			return 0
		}
		return syms.Size(sym)
	}
	if m := k.module(sym.Addr); m != nil {
		i := sort.Search(len(m.syms), func(i int) bool { return m.syms[i].Addr > sym.Addr })
		if i < len(m.syms) {
			return m.syms[i].Addr - sym.Addr
		}
		return m.Base + m.TextSize - sym.Addr
	}
	return 0
}

// LookupSymbol finds a symbol by name in the kernel, then in modules;
// "module:name" looks in one module only.
func (k *Kernel) LookupSymbol(name string) (Symbol, error) {
	mod, fn, scoped := strings.Cut(name, ":")
	if !scoped {
		fn = name
	}
	if !scoped {
		syms, err := k.Symbols()
		if err != nil {
			return Symbol{}, err
		}
		if s, err := syms.Lookup(name); err == nil {
			return s, nil
		}
	}
	mods, _ := k.Modules()
	for _, m := range mods {
		if scoped && m.Name != mod {
			continue
		}
		for _, s := range m.syms {
			if s.Name == fn {
				return s, nil
			}
		}
	}
	return Symbol{}, fmt.Errorf("%q: %w", name, ErrNoSymbol)
}

// orcFinder looks an address up in its module's ORC table, else the
// kernel's.
type orcFinder struct {
	k      *Kernel
	kernel *orc.Table
}

func (f orcFinder) Lookup(ip uint64) (orc.Entry, bool) {
	if m := f.k.module(ip); m != nil {
		if m.orc == nil {
			return orc.Entry{}, false
		}
		return m.orc.Lookup(ip)
	}
	return f.kernel.Lookup(ip)
}
