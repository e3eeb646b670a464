package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cilium/ebpf/btf"
)

// Field is where one struct member lies: byte offset and size.
type Field struct{ Off, Size uint32 }

// Entry is the layout of one table entry: its size, and the 32-bit field
// holding the offset from that field to the instruction it names. Target,
// when its Size is not 0, is a second such field naming where the kernel
// may send a CPU by the table (an exception fixup, a static key's jump
// target): code that is entered without a branch the decoder sees.
type Entry struct {
	Size   uint32
	Rel    Field
	Target Field
}

// KernelLayout is where the fields the no-splice walkers read lie in the
// running kernel's structs. It comes from the kernel's BTF, never from
// numbers written down here: struct module in particular changes with the
// kernel version and configuration.
type KernelLayout struct {
	ListNext Field // list_head.next

	// struct module.
	ModList, ModName, ModState                Field
	ModUnformed                               uint64 // MODULE_STATE_UNFORMED: tables not set up yet
	ModExTable, ModNumExTable                 Field
	ModJumpEntries, ModNumJumpEntries         Field
	ModStaticCallSites, ModNumStaticCallSites Field
	ExTableEntry, JumpEntry, StaticCallSite   Entry // exception_table_entry.insn, jump_entry.code, static_call_site.addr
	FtracePageSize                            uint32
	FtraceNext, FtraceRecords, FtraceIndex    Field // struct ftrace_page
	DynFtrace                                 Entry // struct dyn_ftrace; Rel is its (absolute) ip
}

// ErrLayout is matched by every LayoutError.
var ErrLayout = errors.New("kernel struct layout not in BTF")

// LayoutError names the struct or member BTF did not describe as expected.
type LayoutError struct {
	Type, Member string
	Err          error
}

func (e *LayoutError) Error() string {
	if e.Member == "" {
		return fmt.Sprintf("BTF: struct %s: %v", e.Type, e.Err)
	}
	return fmt.Sprintf("BTF: struct %s.%s: %v", e.Type, e.Member, e.Err)
}

func (e *LayoutError) Is(t error) bool { return t == ErrLayout }
func (e *LayoutError) Unwrap() error   { return e.Err }

// LayoutFromBTF reads the layout from a kernel BTF spec (vmlinux's: struct
// module, struct ftrace_page and the table entry types all live there).
func LayoutFromBTF(spec *btf.Spec) (*KernelLayout, error) {
	l := &KernelLayout{}
	b := layoutBuilder{spec: spec, structs: map[string]*btf.Struct{}}
	l.ListNext = b.member("list_head", "next", 8)
	l.ModList = b.member("module", "list", 16)
	l.ModName = b.member("module", "name", 0)
	l.ModState = b.member("module", "state", 0)
	l.ModExTable = b.member("module", "extable", 8)
	l.ModNumExTable = b.member("module", "num_exentries", 0)
	l.ModJumpEntries = b.member("module", "jump_entries", 8)
	l.ModNumJumpEntries = b.member("module", "num_jump_entries", 0)
	l.ModStaticCallSites = b.member("module", "static_call_sites", 8)
	l.ModNumStaticCallSites = b.member("module", "num_static_call_sites", 0)
	l.ExTableEntry = b.entry("exception_table_entry", "insn", 4)
	l.ExTableEntry.Target = b.member("exception_table_entry", "fixup", 4)
	l.JumpEntry = b.entry("jump_entry", "code", 4)
	l.JumpEntry.Target = b.member("jump_entry", "target", 4)
	l.StaticCallSite = b.entry("static_call_site", "addr", 4)
	l.FtracePageSize = b.size("ftrace_page")
	l.FtraceNext = b.member("ftrace_page", "next", 8)
	l.FtraceRecords = b.member("ftrace_page", "records", 8)
	l.FtraceIndex = b.member("ftrace_page", "index", 0)
	l.DynFtrace = b.entry("dyn_ftrace", "ip", 8)
	if b.err == nil {
		var e *btf.Enum
		if err := spec.TypeByName("module_state", &e); err != nil {
			b.err = &LayoutError{Type: "enum module_state", Err: err}
		} else {
			found := false
			for _, v := range e.Values {
				if v.Name == "MODULE_STATE_UNFORMED" {
					l.ModUnformed, found = v.Value, true
				}
			}
			if !found {
				b.err = &LayoutError{Type: "enum module_state", Member: "MODULE_STATE_UNFORMED", Err: errors.New("no such value")}
			}
		}
	}
	if b.err != nil {
		return nil, b.err
	}
	return l, nil
}

// LoadKernelLayout reads the running kernel's layout from
// /sys/kernel/btf/vmlinux.
func LoadKernelLayout() (*KernelLayout, error) {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return nil, fmt.Errorf("kernel BTF: %w", err)
	}
	return LayoutFromBTF(spec)
}

// layoutBuilder collects members, keeping the first error.
type layoutBuilder struct {
	spec    *btf.Spec
	structs map[string]*btf.Struct
	err     error
}

func (b *layoutBuilder) lookup(name string) *btf.Struct {
	if s, ok := b.structs[name]; ok {
		return s
	}
	var s *btf.Struct
	if err := b.spec.TypeByName(name, &s); err != nil {
		if b.err == nil {
			b.err = &LayoutError{Type: name, Err: err}
		}
		return nil
	}
	b.structs[name] = s
	return s
}

func (b *layoutBuilder) size(name string) uint32 {
	if s := b.lookup(name); s != nil {
		return s.Size
	}
	return 0
}

// member finds name.member; want is its required size in bytes (0: any
// scalar up to 8 bytes, or an array, as the caller reads it).
func (b *layoutBuilder) member(name, member string, want uint32) Field {
	s := b.lookup(name)
	if s == nil {
		return Field{}
	}
	for _, m := range s.Members {
		if m.Name != member {
			continue
		}
		sz, err := btf.Sizeof(m.Type)
		switch {
		case err != nil:
		case m.BitfieldSize != 0 || m.Offset%8 != 0:
			err = errors.New("is a bitfield")
		case want != 0 && uint32(sz) != want:
			err = fmt.Errorf("is %d bytes, want %d", sz, want)
		case want == 0 && sz > 8:
			if _, arr := btf.UnderlyingType(m.Type).(*btf.Array); !arr {
				err = fmt.Errorf("is %d bytes, want a scalar", sz)
			}
		}
		if err != nil {
			if b.err == nil {
				b.err = &LayoutError{Type: name, Member: member, Err: err}
			}
			return Field{}
		}
		return Field{Off: m.Offset.Bytes(), Size: uint32(sz)}
	}
	if b.err == nil {
		b.err = &LayoutError{Type: name, Member: member, Err: errors.New("no such member")}
	}
	return Field{}
}

func (b *layoutBuilder) entry(name, member string, want uint32) Entry {
	return Entry{Size: b.size(name), Rel: b.member(name, member, want)}
}

// uintAt reads an unsigned little-endian field of buf.
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
	if f.Size < 8 {
		shift := 64 - 8*f.Size
		return int64(v<<shift) >> shift
	}
	return int64(v)
}
