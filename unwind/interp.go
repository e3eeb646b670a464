package unwind

import (
	"bytes"
	"fmt"
)

// DW_CFA_* opcodes (DWARF 5 §6.4.2, plus the GNU extensions in use).
const (
	cfaAdvanceLoc       = 0x40 // high two bits; delta in the low six
	cfaOffset           = 0x80 // high two bits; register in the low six
	cfaRestore          = 0xc0 // high two bits; register in the low six
	cfaNop              = 0x00
	cfaSetLoc           = 0x01
	cfaAdvanceLoc1      = 0x02
	cfaAdvanceLoc2      = 0x03
	cfaAdvanceLoc4      = 0x04
	cfaOffsetExtended   = 0x05
	cfaRestoreExtended  = 0x06
	cfaUndefined        = 0x07
	cfaSameValue        = 0x08
	cfaRegister         = 0x09
	cfaRememberState    = 0x0a
	cfaRestoreState     = 0x0b
	cfaDefCFA           = 0x0c
	cfaDefCFARegister   = 0x0d
	cfaDefCFAOffset     = 0x0e
	cfaDefCFAExpression = 0x0f
	cfaExpression       = 0x10
	cfaOffsetExtendedSF = 0x11
	cfaDefCFASF         = 0x12
	cfaDefCFAOffsetSF   = 0x13
	cfaValOffset        = 0x14
	cfaValOffsetSF      = 0x15
	cfaValExpression    = 0x16
	cfaMIPSAdvanceLoc8  = 0x1d
	cfaGNUArgsSize      = 0x2e
	cfaGNUNegOffsetExt  = 0x2f
)

// interp runs the CFA program of one FDE (DWARF 5 §6.4.3) and records a
// row for each pc at which the rules it tracks change.
type interp struct {
	f       *fde
	initial rules // after the CIE's initial instructions: what DW_CFA_restore restores
	cur     rules
	stack   []rules
	pc      uint64
	rows    []Row
}

// run executes insns, which start at section offset at. With emit false
// (the CIE's initial instructions) no rows are recorded.
func (in *interp) run(insns []byte, at int, emit bool) error {
	c := in.f.cie
	r := &cfiReader{sec: in.f.sec, pos: at, end: at + len(insns)}
	advance := func(delta uint64) {
		if emit {
			in.emit()
		}
		in.pc += delta * c.codeAlign
	}
	for r.pos < r.end && r.err == nil {
		op := r.u8()
		switch op & 0xc0 {
		case cfaAdvanceLoc:
			advance(uint64(op & 0x3f))
			continue
		case cfaOffset:
			in.set(uint64(op&0x3f), Rule{Kind: RuleOffset, Offset: int64(r.uleb()) * c.dataAlign})
			continue
		case cfaRestore:
			in.restore(uint64(op & 0x3f))
			continue
		}
		switch op {
		case cfaNop:
		case cfaSetLoc:
			enc := c.fdeEnc
			if !in.f.sec.eh {
				enc = peAbsptr
			}
			loc := r.encoded(enc, c.addrSize, in.f.begin)
			if emit {
				in.emit()
			}
			in.pc = loc
		case cfaAdvanceLoc1:
			advance(uint64(r.u8()))
		case cfaAdvanceLoc2:
			advance(uint64(r.u16()))
		case cfaAdvanceLoc4:
			advance(uint64(r.u32()))
		case cfaMIPSAdvanceLoc8:
			advance(r.u64())
		case cfaOffsetExtended:
			reg := r.uleb()
			in.set(reg, Rule{Kind: RuleOffset, Offset: int64(r.uleb()) * c.dataAlign})
		case cfaOffsetExtendedSF:
			reg := r.uleb()
			in.set(reg, Rule{Kind: RuleOffset, Offset: r.sleb() * c.dataAlign})
		case cfaGNUNegOffsetExt:
			reg := r.uleb()
			in.set(reg, Rule{Kind: RuleOffset, Offset: -int64(r.uleb()) * c.dataAlign})
		case cfaValOffset:
			reg := r.uleb()
			in.set(reg, Rule{Kind: RuleValOffset, Offset: int64(r.uleb()) * c.dataAlign})
		case cfaValOffsetSF:
			reg := r.uleb()
			in.set(reg, Rule{Kind: RuleValOffset, Offset: r.sleb() * c.dataAlign})
		case cfaRestoreExtended:
			in.restore(r.uleb())
		case cfaUndefined:
			in.set(r.uleb(), Rule{Kind: RuleUndefined})
		case cfaSameValue:
			in.set(r.uleb(), Rule{Kind: RuleSameValue})
		case cfaRegister:
			reg, from := r.uleb(), r.uleb()
			if from > 255 {
				r.fail("register %d", from)
			}
			in.set(reg, Rule{Kind: RuleRegister, Reg: Reg(from)})
		case cfaExpression:
			reg := r.uleb()
			r.bytes(int(r.uleb()))
			in.set(reg, Rule{Kind: RuleExpression})
		case cfaValExpression:
			reg := r.uleb()
			r.bytes(int(r.uleb()))
			in.set(reg, Rule{Kind: RuleValExpression})
		case cfaRememberState:
			in.stack = append(in.stack, in.cur)
		case cfaRestoreState:
			if n := len(in.stack); n > 0 {
				in.cur = in.stack[n-1]
				in.stack = in.stack[:n-1]
			}
		case cfaDefCFA:
			reg := r.uleb()
			in.defCFA(r, reg, int64(r.uleb()))
		case cfaDefCFASF:
			reg := r.uleb()
			in.defCFA(r, reg, r.sleb()*c.dataAlign)
		case cfaDefCFARegister:
			reg := r.uleb()
			in.defCFA(r, reg, in.cur.cfa.Offset)
		case cfaDefCFAOffset:
			in.cfaOffset(int64(r.uleb()))
		case cfaDefCFAOffsetSF:
			in.cfaOffset(r.sleb() * c.dataAlign)
		case cfaDefCFAExpression:
			in.cur.cfa = classifyCFAExpression(r.bytes(int(r.uleb())))
		case cfaGNUArgsSize:
			r.uleb()
		default:
			r.fail("unknown DW_CFA opcode %#x", op)
		}
	}
	if r.err != nil {
		return r.err
	}
	if emit {
		in.emit()
	}
	return nil
}

func (in *interp) set(reg uint64, rule Rule) {
	switch {
	case reg == uint64(RegRBP):
		in.cur.rbp = rule
	case reg == in.f.cie.raReg:
		in.cur.ra = rule
	}
}

func (in *interp) restore(reg uint64) {
	switch {
	case reg == uint64(RegRBP):
		in.cur.rbp = in.initial.rbp
	case reg == in.f.cie.raReg:
		in.cur.ra = in.initial.ra
	}
}

func (in *interp) defCFA(r *cfiReader, reg uint64, off int64) {
	if reg > 255 {
		r.fail("CFA register %d", reg)
		return
	}
	in.cur.cfa = CFA{Kind: CFARegOffset, Reg: Reg(reg), Offset: off}
}

// cfaOffset changes the offset of a register-based CFA; like readelf it
// leaves an expression-based CFA alone.
func (in *interp) cfaOffset(off int64) {
	if in.cur.cfa.Kind == CFARegOffset {
		in.cur.cfa.Offset = off
	}
}

// emit records the current rules at the current pc: a later row at the
// same pc replaces an earlier one, and a row equal to the one before it
// is dropped. Rows outside the FDE's range are ignored.
func (in *interp) emit() {
	if in.pc < in.f.begin || in.pc >= in.f.end {
		return
	}
	row := Row{PC: in.pc, CFA: in.cur.cfa, RBP: in.cur.rbp, RA: in.cur.ra}
	in.rows = appendRow(in.rows, row)
}

// appendRow adds row to rows (sorted by pc) with the replacement and
// deduplication rules of emit.
func appendRow(rows []Row, row Row) []Row {
	for n := len(rows); n > 0 && rows[n-1].PC >= row.PC; n = len(rows) {
		rows = rows[:n-1]
	}
	if n := len(rows); n > 0 && sameRules(rows[n-1], row) {
		return rows
	}
	return append(rows, row)
}

func sameRules(a, b Row) bool { return a.CFA == b.CFA && a.RBP == b.RBP && a.RA == b.RA }

// The standard .plt CFA expression of binutils (16-byte lazy PLT
// entries; threshold 11 for the classic push/jmp entry, 10 with IBT):
//
//	DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
//	DW_OP_litK; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus
var pltTail = []byte{0x3f, 0x1a, 0xff, 0x2a, 0x33, 0x24, 0x22}

// classifyCFAExpression recognises the .plt expressions; any other
// expression is CFAExpression.
func classifyCFAExpression(expr []byte) CFA {
	r := &cfiReader{sec: &cfiSection{name: "expression", data: expr}, end: len(expr)}
	if r.u8() != 0x77 { // DW_OP_breg7
		return CFA{Kind: CFAExpression}
	}
	off := r.sleb()
	if r.u8() != 0x80 || r.sleb() != 0 { // DW_OP_breg16 0
		return CFA{Kind: CFAExpression}
	}
	rest := r.bytes(len(pltTail))
	if r.err != nil || r.pos != len(expr) || rest[2] < 0x30 || rest[2] > 0x4f {
		return CFA{Kind: CFAExpression}
	}
	k := rest[2] - 0x30
	want := bytes.Clone(pltTail)
	want[2] = rest[2]
	if !bytes.Equal(rest, want) {
		return CFA{Kind: CFAExpression}
	}
	return CFA{Kind: CFAPLT, Offset: off, Threshold: k}
}

// fdeRows runs the CIE's and the FDE's instructions and returns the rows
// for [f.begin, f.end).
func fdeRows(f *fde) ([]Row, error) {
	in := &interp{f: f, pc: f.begin}
	in.cur.cfa = CFA{Kind: CFARegOffset, Reg: RegRSP} // replaced by the CIE's def_cfa
	c := f.cie
	if err := in.run(c.initial, c.initialAt, false); err != nil {
		return nil, fmt.Errorf("CIE at %#x: %w", c.offset, err)
	}
	in.initial = in.cur
	in.stack = in.stack[:0]
	if err := in.run(f.insns, f.insnsAt, true); err != nil {
		return nil, fmt.Errorf("FDE at %#x: %w", f.offset, err)
	}
	return in.rows, nil
}
