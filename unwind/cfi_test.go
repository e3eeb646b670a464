package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// cfiBuilder assembles a CFI section by hand, for cases real binaries do
// not all show: every pointer encoding, every DW_CFA opcode.
type cfiBuilder struct {
	buf  []byte
	addr uint64 // the section's address (pcrel base)
	eh   bool
}

func uleb(v uint64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

func sleb(v int64) []byte {
	var b []byte
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if (v == 0 && c&0x40 == 0) || (v == -1 && c&0x40 != 0) {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// entry appends a length-prefixed entry whose body (after the length)
// is made by body from the address of the body's start.
func (c *cfiBuilder) entry(body func(at int) []byte) int {
	off := len(c.buf)
	b := body(off + 4)
	for (len(b)+4)%8 != 0 {
		b = append(b, cfaNop)
	}
	c.buf = append(c.buf, cat(le32(uint32(len(b))), b)...)
	return off
}

func (c *cfiBuilder) cie(version byte, aug string, augData []byte, ra uint64, insns ...byte) int {
	return c.entry(func(int) []byte {
		id := le32(0)
		if !c.eh {
			id = le32(0xffffffff)
		}
		b := cat(id, []byte{version}, []byte(aug), []byte{0})
		if version == 4 {
			b = append(b, 8, 0)
		}
		b = cat(b, uleb(1), sleb(-8))
		if version == 1 {
			b = append(b, byte(ra))
		} else {
			b = append(b, uleb(ra)...)
		}
		if strings.HasPrefix(aug, "z") {
			b = cat(b, uleb(uint64(len(augData))), augData)
		}
		return append(b, insns...)
	})
}

// fde appends an FDE; addr makes the address fields from the address of
// the field.
func (c *cfiBuilder) fde(cieOff int, addr func(field uint64) []byte, augData []byte, insns ...byte) {
	c.entry(func(at int) []byte {
		ptr := le32(uint32(at - cieOff))
		if !c.eh {
			ptr = le32(uint32(cieOff))
		}
		b := cat(ptr, addr(c.addr+uint64(at+4)))
		if augData != nil {
			b = cat(b, uleb(uint64(len(augData))), augData)
		}
		return append(b, insns...)
	})
}

func (c *cfiBuilder) section(name string) *cfiSection {
	s := &cfiSection{name: name, data: c.buf, eh: c.eh}
	if c.eh {
		s.addr = c.addr
	}
	return s
}

func rowStrings(t *Table) []string {
	var out []string
	for _, r := range tableRows(t) {
		out = append(out, fmt.Sprintf("%#x %s %s %s", r.pc, r.cfa, r.rbp, r.ra))
	}
	return out
}

// The .plt expression with threshold k, and glibc's signal-frame CFA.
func pltExpr(k byte) []byte {
	return cat([]byte{0x77}, sleb(8), []byte{0x80}, sleb(0), []byte{0x3f, 0x1a, 0x30 + k, 0x2a, 0x33, 0x24, 0x22})
}

var derefExpr = cat([]byte{0x77}, sleb(160), []byte{0x06})

func TestSyntheticCFI(t *testing.T) {
	eh := &cfiBuilder{addr: 0x10000, eh: true}
	// "zR", FDE addresses pcrel|sdata4; initial: CFA rsp+8, ra at c-8.
	zr := eh.cie(1, "zR", []byte{pePCRel | peSdata4}, 16, cfaDefCFA, 7, 8, cfaOffset|16, 1)
	pcrel := func(begin, size uint32) func(uint64) []byte {
		return func(field uint64) []byte { return cat(le32(begin-uint32(field)), le32(size)) }
	}
	insns := cat(
		[]byte{cfaAdvanceLoc | 1, cfaDefCFAOffset}, uleb(16), []byte{cfaOffset | 6, 2}, // 0x2001
		[]byte{cfaAdvanceLoc1, 3, cfaDefCFARegister, 6},                                               // 0x2004
		[]byte{cfaAdvanceLoc2}, le16(0x10), []byte{cfaRememberState, cfaDefCFA, 7, 8, cfaRestore | 6}, // 0x2014
		[]byte{cfaAdvanceLoc4}, le32(2), []byte{cfaRestoreState}, // 0x2016
		[]byte{cfaAdvanceLoc | 4, cfaGNUArgsSize, 16, cfaDefCFASF, 7}, sleb(-3), []byte{cfaValOffset, 6, 1}, // 0x201a: rsp+24 v-8
		[]byte{cfaAdvanceLoc | 1, cfaRegister, 6, 3, cfaSameValue, 16},                                // 0x201b
		[]byte{cfaAdvanceLoc | 1, cfaOffsetExtendedSF, 6}, sleb(2), []byte{cfaGNUNegOffsetExt, 16, 1}, // 0x201c: c-16 c+8
		[]byte{cfaAdvanceLoc | 1, cfaDefCFAExpression}, uleb(uint64(len(pltExpr(10)))), pltExpr(10), // 0x201d
		[]byte{cfaDefCFAOffset, 40},                                                             // an expression CFA keeps its expression
		[]byte{cfaAdvanceLoc | 1, cfaDefCFAExpression}, uleb(uint64(len(derefExpr))), derefExpr, // 0x201e
		[]byte{cfaExpression, 6, 3, 0x77}, sleb(120), []byte{cfaValExpression, 16, 1, 0x30},
		// 0x201f: def_cfa_register after expressions takes the last offset set (40).
		[]byte{cfaAdvanceLoc | 1, cfaDefCFARegister, 7, cfaRestoreExtended, 6, cfaUndefined, 16},
		[]byte{cfaAdvanceLoc | 1, cfaValOffsetSF, 6}, sleb(-1), []byte{cfaOffsetExtended, 16, 1}, // 0x2020: v+8 c-8
		[]byte{cfaDefCFAOffsetSF}, sleb(-4), // rsp+32
		[]byte{cfaAdvanceLoc | 1, cfaDefCFAOffset, 8}, // 0x2021 rsp+8 v+8 c-8
		[]byte{cfaAdvanceLoc | 1, cfaDefCFAOffset, 8}, // no change: no row
	)
	eh.fde(zr, pcrel(0x2000, 0x40), []byte{}, insns...)
	// An FDE whose program has an unknown opcode is skipped.
	eh.fde(zr, pcrel(0x2100, 0x10), []byte{}, cfaAdvanceLoc|1, 0x3f)
	// "zPLR": an indirect pcrel personality, an LSDA, absolute udata4 FDE
	// addresses, and an FDE with only nops (the CIE's rules).
	var pers []byte
	pers = append(pers, peIndirect|pePCRel|peSdata4)
	pers = append(pers, le32(0x100)...)
	zplr := eh.cie(3, "zPLR", cat(pers, []byte{pePCRel | peSdata4, peUdata4}), 16, cfaDefCFA, 7, 8, cfaOffset|16, 1)
	eh.fde(zplr, func(uint64) []byte { return cat(le32(0x3000), le32(0x10)) }, le32(0), cfaNop, cfaNop)
	// "zRS": a signal frame CIE with datarel FDE addresses.
	zrs := eh.cie(1, "zRS", []byte{peDataRel | peSdata4}, 16, cfaDefCFA, 7, 8)
	eh.fde(zrs, func(uint64) []byte { return cat(le32(0x100), le32(0x8)) }, []byte{}, cfaAdvanceLoc|4, cfaDefCFAOffset, 16)
	eh.buf = append(eh.buf, le32(0)...) // zero terminator

	dbg := &cfiBuilder{}
	v4 := dbg.cie(4, "", nil, 16, cfaDefCFA, 7, 8, cfaOffset|16, 1)
	abs := func(begin, size uint64) func(uint64) []byte {
		return func(uint64) []byte { return cat(le64(begin), le64(size)) }
	}
	dbg.fde(v4, abs(0x2000, 0x40), nil, cfaAdvanceLoc|1, cfaDefCFAOffset, 99) // .eh_frame wins
	dbg.fde(v4, abs(0x4000, 0x20), nil, cfaAdvanceLoc|2, cfaDefCFAOffset, 16)

	persRead := 0
	b := bases{data: 0x5000, readPtr: func(addr uint64) (uint64, bool) { persRead++; return 0xdead, true }}
	tab, err := compile([]*cfiSection{eh.section(".eh_frame"), dbg.section(".debug_frame")}, b)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"0x2000 rsp+8 u c-8",
		"0x2001 rsp+16 c-16 c-8",
		"0x2004 rbp+16 c-16 c-8",
		"0x2014 rsp+8 u c-8",
		"0x2016 rbp+16 c-16 c-8",
		"0x201a rsp+24 v-8 c-8",
		"0x201b rsp+24 r3 (rbx) s",
		"0x201c rsp+24 c-16 c+8",
		"0x201d exp c-16 c+8",
		"0x201e exp exp vexp",
		"0x201f rsp+40 u u",
		"0x2020 rsp+32 v+8 c-8",
		"0x2021 rsp+8 v+8 c-8",
		"0x2040 u u u",
		// 0x2100..0x2110 is skipped: its range has no rules.
		"0x3000 rsp+8 u c-8",
		"0x3010 u u u",
		"0x4000 rsp+8 u c-8",
		"0x4002 rsp+16 u c-8",
		"0x4020 u u u",
		"0x5100 rsp+8 u u",
		"0x5104 rsp+16 u u",
		"0x5108 u u u",
	}
	if got := rowStrings(tab); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if tab.FDEs != 5 || tab.Skipped != 1 { // the .debug_frame FDE at 0x2000 is dropped
		t.Errorf("FDEs %d skipped %d, want 5 and 1", tab.FDEs, tab.Skipped)
	}
	if persRead != 1 {
		t.Errorf("personality pointer read %d times, want 1", persRead)
	}
	if r, err := tab.Lookup(0x201d); err != nil || r.CFA != (CFA{Kind: CFAPLT, Offset: 8, Threshold: 10}) {
		t.Errorf("Lookup(0x201d) = %+v, %v; want the .plt form with threshold 10", r, err)
	}
	if r, err := tab.Lookup(0x201e); err != nil || r.CFA != (CFA{Kind: CFADeref, Reg: RegRSP, Offset: 160}) ||
		r.RBP != (Rule{Kind: RuleAtSP, Offset: 120}) || r.RA.Kind != RuleValExpression {
		t.Errorf("Lookup(0x201e) = %+v, %v; want CFA [rsp+160], rbp at rsp+120, ra vexp", r, err)
	}
	for _, pc := range []uint64{0x1fff, 0x2040, 0x2105, 0x3010, 0x6000} {
		if _, err := tab.Lookup(pc); !errors.Is(err, ErrNoFDE) {
			t.Errorf("Lookup(%#x): %v, want ErrNoFDE", pc, err)
		}
	}
}

func le16(v uint16) []byte { return binary.LittleEndian.AppendUint16(nil, v) }

func TestMalformedCFI(t *testing.T) {
	good := func() *cfiBuilder {
		c := &cfiBuilder{addr: 0x1000, eh: true}
		id := c.cie(1, "zR", []byte{peUdata4}, 16, cfaDefCFA, 7, 8)
		c.fde(id, func(uint64) []byte { return cat(le32(0x2000), le32(0x10)) }, []byte{})
		return c
	}
	for _, tc := range []struct {
		name string
		edit func(c *cfiBuilder)
	}{
		{"truncated", func(c *cfiBuilder) { c.buf = c.buf[:len(c.buf)-3] }},
		{"length past the end", func(c *cfiBuilder) { binary.LittleEndian.PutUint32(c.buf, 0x1000) }},
		{"CIE version 2", func(c *cfiBuilder) { c.buf[8] = 2 }},
		{"unknown augmentation", func(c *cfiBuilder) {
			c.buf = nil
			c.cie(1, "x", nil, 16)
		}},
		{"CIE pointer outside", func(c *cfiBuilder) {
			c.buf = nil
			c.fde(-0x1000, func(uint64) []byte { return cat(le32(0), le32(1)) }, nil)
		}},
		{"unknown pointer encoding", func(c *cfiBuilder) {
			c.buf = nil
			id := c.cie(1, "zR", []byte{0x0f}, 16)
			c.fde(id, func(uint64) []byte { return cat(le32(0), le32(1)) }, nil)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.edit(c)
			_, err := compile([]*cfiSection{c.section(".eh_frame")}, bases{})
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v, want ErrFormat", err)
			}
		})
	}
	if _, err := compile([]*cfiSection{good().section(".eh_frame")}, bases{}); err != nil {
		t.Fatalf("the unedited section: %v", err)
	}
}

func TestClassifyExpressions(t *testing.T) {
	for _, tc := range []struct {
		expr []byte
		want CFA
	}{
		{pltExpr(11), CFA{Kind: CFAPLT, Offset: 8, Threshold: 11}},
		{pltExpr(10), CFA{Kind: CFAPLT, Offset: 8, Threshold: 10}},
		{derefExpr, CFA{Kind: CFADeref, Reg: RegRSP, Offset: 160}},
		{cat([]byte{0x76}, sleb(-8), []byte{0x06}), CFA{Kind: CFADeref, Reg: RegRBP, Offset: -8}},
		// libgcrypt's [rsp+536]+56, a truncated .plt form, a literal, nothing:
		{cat([]byte{0x77}, sleb(536), []byte{0x06, 0x23}, uleb(56)), CFA{Kind: CFAExpression}},
		{pltExpr(11)[:len(pltExpr(11))-1], CFA{Kind: CFAExpression}},
		{[]byte{0x30}, CFA{Kind: CFAExpression}},
		{nil, CFA{Kind: CFAExpression}},
	} {
		if got := classifyCFAExpression(tc.expr); got != tc.want {
			t.Errorf("CFA % x: %+v, want %+v", tc.expr, got, tc.want)
		}
	}
	for _, tc := range []struct {
		expr []byte
		want Rule
	}{
		{cat([]byte{0x77}, sleb(168)), Rule{Kind: RuleAtSP, Offset: 168}},
		{cat([]byte{0x76}, sleb(168)), Rule{Kind: RuleExpression}},
		{cat([]byte{0x77}, sleb(168), []byte{0x06}), Rule{Kind: RuleExpression}},
	} {
		if got := classifyRegExpression(tc.expr); got != tc.want {
			t.Errorf("register % x: %+v, want %+v", tc.expr, got, tc.want)
		}
	}
}
