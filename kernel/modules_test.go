package kernel

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// moduleTypes describes struct module with its text either in
// core_layout (before 6.4) or in mem[MOD_TEXT] (6.4 on), or in neither.
func moduleTypes(text string) []btf.Type {
	u32 := &btf.Int{Name: "unsigned int", Size: 4}
	char := &btf.Int{Name: "char", Size: 1, Encoding: btf.Char}
	ptr := &btf.Pointer{Target: &btf.Void{}}
	m := func(name string, typ btf.Type, off uint32) btf.Member {
		return btf.Member{Name: name, Type: typ, Offset: btf.Bits(off * 8)}
	}
	list := &btf.Struct{Name: "list_head", Size: 16, Members: []btf.Member{m("next", ptr, 0), m("prev", ptr, 8)}}
	state := &btf.Enum{Name: "module_state", Size: 4, Values: []btf.EnumValue{{Name: "MODULE_STATE_LIVE", Value: 0}, {Name: "MODULE_STATE_UNFORMED", Value: 3}}}
	members := []btf.Member{m("state", state, 0), m("list", list, 8), m("name", &btf.Array{Index: u32, Type: char, Nelems: 56}, 24),
		m("kallsyms", ptr, 80)}
	types := []btf.Type{list, state}
	switch text {
	case "core_layout":
		layout := &btf.Struct{Name: "module_layout", Size: 16, Members: []btf.Member{m("base", ptr, 0), m("size", u32, 8), m("text_size", u32, 12)}}
		members = append(members, m("core_layout", layout, 96))
	case "mem":
		mem := &btf.Struct{Name: "module_memory", Size: 16, Members: []btf.Member{m("base", ptr, 0), m("size", u32, 8)}}
		// MOD_TEXT is not 0 here, so a reader that assumed it would read
		// another range.
		types = append(types, &btf.Enum{Name: "mod_mem_type", Size: 4, Values: []btf.EnumValue{{Name: "MOD_DATA", Value: 0}, {Name: "MOD_TEXT", Value: 1}}})
		members = append(members, m("mem", &btf.Array{Index: u32, Type: mem, Nelems: 2}, 96))
	}
	ks := &btf.Struct{Name: "mod_kallsyms", Size: 32, Members: []btf.Member{m("symtab", ptr, 0), m("num_symtab", u32, 8), m("strtab", ptr, 16), m("typetab", ptr, 24)}}
	return append(types, &btf.Struct{Name: "module", Size: 136, Members: members}, ks)
}

func TestModuleLayoutByBTF(t *testing.T) {
	for _, tc := range []struct {
		text           string
		base, textSize Field
		err            string
	}{
		{text: "core_layout", base: Field{96, 8}, textSize: Field{108, 4}},
		{text: "mem", base: Field{112, 8}, textSize: Field{120, 4}}, // mem[1]
		{text: "", err: "core_layout (before 6.4) or mem (6.4 on)"},
	} {
		l, err := ModuleLayoutFromBTF(&Types{Spec: specFromTypes(t, moduleTypes(tc.text))})
		if tc.err != "" {
			if !errors.Is(err, ErrLayout) || !errors.Is(err, ErrNoMember) || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want a layout error naming %s", tc.text, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		if l.Base != tc.base || l.TextSize != tc.textSize || l.Name != (Field{24, 56}) || l.Unformed != 3 {
			t.Errorf("%s: %+v", tc.text, l)
		}
		// No jump labels or static calls in this kernel: absent, not an
		// error, for a walk that does not read them.
		if l.JumpEntries.Size != 0 || l.ORCUnwind.Size != 0 {
			t.Errorf("%s: absent members got fields: %+v", tc.text, l)
		}
	}
}

// TestReadModules walks a list of two modules laid out as 6.4 does, one
// being loaded, and reads the live one's symbols.
func TestReadModules(t *testing.T) {
	l, err := ModuleLayoutFromBTF(&Types{Spec: specFromTypes(t, moduleTypes("mem"))})
	if err != nil {
		t.Fatal(err)
	}
	const head, mod1, mod2, ks = 0xffffffff83000000, 0xffffffffc0010000, 0xffffffffc0020000, 0xffffffffc0030000
	const text = 0xffffffffc0100000
	le := binary.LittleEndian
	mem := memReader{head: le.AppendUint64(nil, mod1+8)}
	module := func(name string, state uint32, next, base uint64, size uint32, kallsyms uint64) []byte {
		b := make([]byte, 136)
		le.PutUint32(b, state)
		le.PutUint64(b[8:], next)
		copy(b[24:], name)
		le.PutUint64(b[80:], kallsyms)
		le.PutUint64(b[112:], base) // mem[MOD_TEXT]
		le.PutUint32(b[120:], size)
		return b
	}
	mem[mod1] = module("evdev", 0, mod2+8, text, 0x2000, ks)
	mem[mod2] = module("coming", 3, head, 0, 0, 0)
	// mod_kallsyms: the null symbol, evdev_read (text), a data symbol
	// outside the text (kept out), evdev_open.
	kb := make([]byte, 32)
	le.PutUint64(kb, ks+0x100)
	le.PutUint32(kb[8:], 4)
	le.PutUint64(kb[16:], ks+0x200)
	le.PutUint64(kb[24:], ks+0x2000)
	mem[ks] = kb
	symtab := make([]byte, 4*24)
	for i, s := range []struct {
		name  uint32
		value uint64
	}{{0, 0}, {1, text + 0x40}, {12, text + 0x9000}, {20, text}} {
		le.PutUint32(symtab[i*24:], s.name)
		le.PutUint16(symtab[i*24+6:], 1)
		le.PutUint64(symtab[i*24+8:], s.value)
	}
	mem[ks+0x100] = symtab
	// The string table's extent is unknown: its reader reads on to the
	// end of the page.
	mem[ks+0x200] = append([]byte("\x00evdev_read\x00evdev_x\x00evdev_open\x00"), make([]byte, 0xe00)...)
	mem[ks+0x2000] = []byte("?tdT")

	mods, err := ReadModules(mem, head, l)
	if err != nil {
		t.Fatal(err)
	}
	if len(mods) != 2 || mods[0].Name != "evdev" || !mods[0].Formed || mods[0].Base != text || mods[0].Size != 0x2000 ||
		mods[0].TextSize != 0x2000 || mods[1].Name != "coming" || mods[1].Formed {
		t.Fatalf("modules %+v %+v", mods[0], mods[1])
	}
	syms, err := ReadModuleSymbols(mem, mods[0], l)
	if err != nil {
		t.Fatal(err)
	}
	want := []Symbol{{Addr: text, Type: 'T', Name: "evdev_open", Module: "evdev"}, {Addr: text + 0x40, Type: 't', Name: "evdev_read", Module: "evdev"}}
	if len(syms) != len(want) || syms[0] != want[0] || syms[1] != want[1] {
		t.Errorf("symbols %+v, want %+v", syms, want)
	}

	// With mem[MOD_DATA] set (6.4 on: data apart from text), the data
	// symbol in it is the module's too.
	b := module("evdev", 0, mod2+8, text, 0x2000, ks)
	le.PutUint64(b[96:], text+0x8000) // mem[MOD_DATA]
	le.PutUint32(b[104:], 0x2000)
	mem[mod1] = b
	if mods, err = ReadModules(mem, head, l); err != nil || len(mods[0].Other) != 1 {
		t.Fatalf("modules with a data range: %v %+v", err, mods)
	}
	if syms, err = ReadModuleSymbols(mem, mods[0], l); err != nil || len(syms) != 3 || syms[2] != (Symbol{Addr: text + 0x9000, Type: 'd', Name: "evdev_x", Module: "evdev"}) {
		t.Errorf("symbols with a data range: %v %+v", err, syms)
	}

	// A list that runs into a null pointer, or loops without coming back
	// to its head, is an error, not a hang.
	mem[mod2] = module("coming", 3, 0, 0, 0, 0)
	if _, err := ReadModules(mem, head, l); !errors.Is(err, ErrList) || !strings.Contains(err.Error(), "null pointer") {
		t.Errorf("null next: %v", err)
	}
	mem[mod2] = module("coming", 3, mod1+8, 0, 0, 0)
	if _, err := ReadModules(mem, head, l); !errors.Is(err, ErrList) || !strings.Contains(err.Error(), "loops") {
		t.Errorf("loop: %v", err)
	}
	mem[mod2] = module("coming", 3, 0xdead0000, 0, 0, 0)
	var le2 *ListError
	if _, err := ReadModules(mem, head, l); !errors.As(err, &le2) || le2.Err == nil {
		t.Errorf("unreadable entry: %v", err)
	}
}
