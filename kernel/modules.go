package kernel

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// ModuleLayout is where the fields kinst reads lie in struct module and
// struct mod_kallsyms, from BTF. One walk of the kernel's `modules` list
// (ReadModules) serves every reader: the owned-site tables, the
// postmortem symbols and ORC tables.
//
// Kernel-version caveats, decided by what BTF has rather than by version
// number: the module's text is core_layout.{base,size,text_size} before
// 6.4 and mem[MOD_TEXT].{base,size} from 6.4 (then Size is the text's
// size, and data, rodata and ro_after_init have ranges of their own:
// Other). The tables' and ORC's fields exist only with the options
// that make them (jump labels, inline static calls, the ORC unwinder);
// a Field of Size 0 means absent.
type ModuleLayout struct {
	List, Name, State Field
	Unformed          uint64 // MODULE_STATE_UNFORMED: being loaded, tables not set up yet

	// The module's core text: Base, Size of the core memory, TextSize of
	// its text at the start of it.
	Base, Size, TextSize Field
	// From 6.4: mem[MOD_DATA], mem[MOD_RODATA], mem[MOD_RO_AFTER_INIT]
	// {base, size}, where a module's data symbols lie.
	Other [][2]Field

	ExTable, NumExTable                 Field
	JumpEntries, NumJumpEntries         Field
	StaticCallSites, NumStaticCallSites Field

	NumORCs, ORCUnwindIP, ORCUnwind Field // struct mod_arch_specific

	Kallsyms                           Field // struct mod_kallsyms *
	Symtab, NumSymtab, Strtab, Typetab Field // in struct mod_kallsyms
}

// ModuleLayoutFromBTF reads the layout. The list, name, state and text
// range are required; the rest are read where BTF has them.
func ModuleLayoutFromBTF(t *Types) (*ModuleLayout, error) {
	l := &ModuleLayout{}
	var errs []error
	need := func(dst *Field, st, path string, want uint32) {
		f, err := t.Field(st, path, want)
		errs = append(errs, err)
		*dst = f
	}
	opt := func(dst *Field, st, path string, want uint32) {
		if f, err := t.Field(st, path, want); err == nil {
			*dst = f
		}
	}
	need(&l.List, "module", "list", 16)
	need(&l.Name, "module", "name", 0)
	need(&l.State, "module", "state", 0)
	unformed, err := t.EnumValue("module_state", "MODULE_STATE_UNFORMED")
	errs = append(errs, err)
	l.Unformed = unformed
	switch {
	case t.HasMember("module", "core_layout"):
		need(&l.Base, "module", "core_layout.base", 8)
		need(&l.Size, "module", "core_layout.size", 0)
		need(&l.TextSize, "module", "core_layout.text_size", 0)
	case t.HasMember("module", "mem"):
		text, err := t.EnumValue("mod_mem_type", "MOD_TEXT")
		errs = append(errs, err)
		mem := fmt.Sprintf("mem[%d]", text)
		need(&l.Base, "module", mem+".base", 8)
		need(&l.Size, "module", mem+".size", 0)
		l.TextSize = l.Size
		for _, kind := range []string{"MOD_DATA", "MOD_RODATA", "MOD_RO_AFTER_INIT"} {
			if v, err := t.EnumValue("mod_mem_type", kind); err == nil {
				var b, s Field
				opt(&b, "module", fmt.Sprintf("mem[%d].base", v), 8)
				opt(&s, "module", fmt.Sprintf("mem[%d].size", v), 0)
				if b.Size != 0 && s.Size != 0 {
					l.Other = append(l.Other, [2]Field{b, s})
				}
			}
		}
	default:
		errs = append(errs, &LayoutError{Type: "module", Member: "core_layout (before 6.4) or mem (6.4 on)", Err: ErrNoMember})
	}
	opt(&l.ExTable, "module", "extable", 8)
	opt(&l.NumExTable, "module", "num_exentries", 0)
	opt(&l.JumpEntries, "module", "jump_entries", 8)
	opt(&l.NumJumpEntries, "module", "num_jump_entries", 0)
	opt(&l.StaticCallSites, "module", "static_call_sites", 8)
	opt(&l.NumStaticCallSites, "module", "num_static_call_sites", 0)
	opt(&l.NumORCs, "module", "arch.num_orcs", 0)
	opt(&l.ORCUnwindIP, "module", "arch.orc_unwind_ip", 8)
	opt(&l.ORCUnwind, "module", "arch.orc_unwind", 8)
	opt(&l.Kallsyms, "module", "kallsyms", 8)
	if l.Kallsyms.Size != 0 {
		opt(&l.Symtab, "mod_kallsyms", "symtab", 8)
		opt(&l.NumSymtab, "mod_kallsyms", "num_symtab", 0)
		opt(&l.Strtab, "mod_kallsyms", "strtab", 8)
		opt(&l.Typetab, "mod_kallsyms", "typetab", 8)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return l, nil
}

// structSize is how much of struct module the walk reads: up to the end
// of the last field used.
func (l *ModuleLayout) structSize() uint32 {
	var n uint32
	for _, f := range []Field{l.List, l.Name, l.State, l.Base, l.Size, l.TextSize, l.ExTable, l.NumExTable,
		l.JumpEntries, l.NumJumpEntries, l.StaticCallSites, l.NumStaticCallSites, l.NumORCs, l.ORCUnwindIP,
		l.ORCUnwind, l.Kallsyms} {
		n = max(n, f.Off+f.Size)
	}
	for _, o := range l.Other {
		n = max(n, o[0].Off+o[0].Size, o[1].Off+o[1].Size)
	}
	return n
}

// Module is one entry of the kernel's module list: what its struct
// module says, read once.
type Module struct {
	Name     string
	Addr     uint64 // the struct module
	Formed   bool   // past MODULE_STATE_UNFORMED: its tables are set up
	Base     uint64 // its core text (see ModuleLayout)
	Size     uint64
	TextSize uint64
	// Other holds the module's data ranges kept apart from its text
	// (6.4 on): {base, size} each.
	Other [][2]uint64

	ExTable, JumpEntries, StaticCallSites Table

	// ORC is the module's ORC unwind table (struct mod_arch_specific);
	// zero without the ORC unwinder.
	ORC struct{ IP, Unwind, Count uint64 }

	kallsyms uint64 // struct mod_kallsyms *, 0 if none
}

// Table is a kernel table in memory: Count entries at Addr.
type Table struct {
	Addr  uint64
	Count int64
}

// Contains reports whether addr is in the module's core memory.
// Contains reports whether addr lies in the module's core memory: its
// text, or (6.4 on) one of its data ranges.
func (m *Module) Contains(addr uint64) bool {
	if addr >= m.Base && addr-m.Base < m.Size {
		return true
	}
	for _, o := range m.Other {
		if addr >= o[0] && addr-o[0] < o[1] {
			return true
		}
	}
	return false
}

// Bounds on a walk, so that a corrupt or racing list cannot make it run
// away.
const (
	maxModules    = 1 << 14
	maxListLength = 1 << 20
	maxModSyms    = 1 << 20
	elfSymSize    = 24 // Elf64_Sym
)

// ErrList is matched by every ListError.
var ErrList = errors.New("kernel list unreadable")

// ListError says why a list_head walk stopped.
type ListError struct {
	Head, At uint64
	Why      string
	Err      error // a read error, or nil
}

func (e *ListError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("list at %#x: entry %#x: %s: %v", e.Head, e.At, e.Why, e.Err)
	}
	return fmt.Sprintf("list at %#x: %s at %#x", e.Head, e.Why, e.At)
}

func (e *ListError) Is(t error) bool { return t == ErrList }
func (e *ListError) Unwrap() error   { return e.Err }

// WalkList calls f for each entry of the circular list whose list_head is
// at head, the entries embedding their list_head at entryOff (the
// kernel's list_for_each_entry). list_head.next is its first member, as
// it has been since the type exists. A list that ends in a null pointer,
// comes back to an entry other than head or runs past limit entries is
// an error, not a hang.
func WalkList(r Reader, head, entryOff uint64, limit int, f func(entry uint64) error) error {
	var b [8]byte
	if err := r.Read(head, b[:]); err != nil {
		return &ListError{Head: head, At: head, Why: "unreadable head", Err: err}
	}
	p := binary.LittleEndian.Uint64(b[:])
	seen := map[uint64]bool{}
	for p != head {
		switch {
		case p == 0:
			return &ListError{Head: head, At: p, Why: "ends in a null pointer without returning to its head"}
		case seen[p]:
			return &ListError{Head: head, At: p, Why: "loops back without returning to its head (corrupt memory?)"}
		case len(seen) == limit:
			return &ListError{Head: head, At: p, Why: fmt.Sprintf("more than %d entries", limit)}
		}
		seen[p] = true
		if err := f(p - entryOff); err != nil {
			return err
		}
		if err := r.Read(p, b[:]); err != nil {
			return &ListError{Head: head, At: p, Why: "unreadable", Err: err}
		}
		p = binary.LittleEndian.Uint64(b[:])
	}
	return nil
}

// ReadModules walks the kernel's `modules` list (head: the address of the
// symbol `modules`), in list order: the newest module first.
func ReadModules(r Reader, head uint64, l *ModuleLayout) ([]*Module, error) {
	buf := make([]byte, l.structSize())
	var mods []*Module
	err := WalkList(r, head, uint64(l.List.Off), maxModules, func(addr uint64) error {
		if err := r.Read(addr, buf); err != nil {
			return &ListError{Head: head, At: addr, Why: "struct module unreadable", Err: err}
		}
		name, _, _ := bytes.Cut(buf[l.Name.Off:l.Name.Off+l.Name.Size], []byte{0})
		m := &Module{
			Name: string(name), Addr: addr, Formed: uintAt(buf, l.State) != l.Unformed,
			Base: uintAt(buf, l.Base), Size: uintAt(buf, l.Size), TextSize: uintAt(buf, l.TextSize),
			ExTable:         Table{uintAt(buf, l.ExTable), intAt(buf, l.NumExTable)},
			JumpEntries:     Table{uintAt(buf, l.JumpEntries), intAt(buf, l.NumJumpEntries)},
			StaticCallSites: Table{uintAt(buf, l.StaticCallSites), intAt(buf, l.NumStaticCallSites)},
			kallsyms:        uintAt(buf, l.Kallsyms),
		}
		for _, o := range l.Other {
			if b, s := uintAt(buf, o[0]), uintAt(buf, o[1]); b != 0 && s != 0 {
				m.Other = append(m.Other, [2]uint64{b, s})
			}
		}
		m.ORC.Count, m.ORC.IP, m.ORC.Unwind = uintAt(buf, l.NumORCs), uintAt(buf, l.ORCUnwindIP), uintAt(buf, l.ORCUnwind)
		mods = append(mods, m)
		return nil
	})
	return mods, err
}

// ReadModuleSymbols reads the symbols the kernel keeps for a module
// (mod->kallsyms: an ELF symbol table, its string table and a kallsyms
// type letter per symbol), keeping those inside the module's core
// memory. A module whose tables cannot be read has no symbols; only the
// layout's absence is an error.
func ReadModuleSymbols(r Reader, m *Module, l *ModuleLayout) ([]Symbol, error) {
	if l.Symtab.Size == 0 || l.NumSymtab.Size == 0 || l.Strtab.Size == 0 || l.Typetab.Size == 0 {
		return nil, &LayoutError{Type: "mod_kallsyms", Err: ErrNoMember}
	}
	if m.kallsyms == 0 {
		return nil, nil
	}
	ks := make([]byte, max(l.Symtab.Off+l.Symtab.Size, l.NumSymtab.Off+l.NumSymtab.Size, l.Strtab.Off+l.Strtab.Size, l.Typetab.Off+l.Typetab.Size))
	if r.Read(m.kallsyms, ks) != nil {
		return nil, nil
	}
	num, symtab, strtab, typetab := uintAt(ks, l.NumSymtab), uintAt(ks, l.Symtab), uintAt(ks, l.Strtab), uintAt(ks, l.Typetab)
	if num == 0 || num > maxModSyms || symtab == 0 || strtab == 0 || typetab == 0 {
		return nil, nil
	}
	st := make([]byte, num*elfSymSize)
	types := make([]byte, num)
	if r.Read(symtab, st) != nil || r.Read(typetab, types) != nil {
		return nil, nil // the module still bounds addresses
	}
	maxName := uint64(0)
	for i := uint64(0); i < num; i++ {
		maxName = max(maxName, uint64(binary.LittleEndian.Uint32(st[i*elfSymSize:])))
	}
	strs := readUpTo(r, strtab, int(maxName)+256)
	var syms []Symbol
	for i := uint64(0); i < num; i++ {
		e := st[i*elfSymSize:]
		nameOff := uint64(binary.LittleEndian.Uint32(e))
		shndx := binary.LittleEndian.Uint16(e[6:])
		value := binary.LittleEndian.Uint64(e[8:])
		if shndx == 0 || nameOff >= uint64(len(strs)) || !m.Contains(value) {
			continue
		}
		nm, _, _ := bytes.Cut(strs[nameOff:], []byte{0})
		if len(nm) == 0 {
			continue
		}
		syms = append(syms, Symbol{Addr: value, Type: types[i], Name: string(nm), Module: m.Name})
	}
	sort.SliceStable(syms, func(i, j int) bool { return syms[i].Addr < syms[j].Addr })
	return syms, nil
}

// pageSize is the granule at which kernel memory is mapped or not.
const pageSize = 4096

// readUpTo reads up to n bytes at addr, stopping early at an unreadable
// page: a string table's extent is not known, only a bound on it.
func readUpTo(r Reader, addr uint64, n int) []byte {
	b := make([]byte, n)
	done := 0
	for done < n {
		a := addr + uint64(done)
		chunk := min(n-done, int(pageSize-a%pageSize))
		if r.Read(a, b[done:done+chunk]) != nil {
			break
		}
		done += chunk
	}
	return b[:done]
}

// uintAt reads an unsigned little-endian field of buf; 0 for an absent
// field.
func uintAt(buf []byte, f Field) uint64 {
	if int(f.Off)+int(f.Size) > len(buf) {
		return 0
	}
	b := buf[f.Off:]
	switch f.Size {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	case 8:
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// intAt reads a signed little-endian field of buf.
func intAt(buf []byte, f Field) int64 {
	v := uintAt(buf, f)
	if f.Size < 8 && f.Size > 0 {
		shift := 64 - 8*f.Size
		return int64(v<<shift) >> shift
	}
	return int64(v)
}
