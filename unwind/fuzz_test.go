package unwind

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The seed corpora in testdata/fuzz are cut from real files: the
// .eh_frame of /bin/true, the .debug_frame and .eh_frame of small
// objects and a small static executable, glibc's and GCC's CFA
// expressions, and crashers found so far.

// checkTable checks what every compiled table must satisfy: rows in
// strictly increasing pc order, each found again by Lookup, and
// FuncStart at or below the pc.
func checkTable(t *testing.T, tab *Table) {
	t.Helper()
	for i := 0; i < tab.Len(); i++ {
		r := tab.Row(i)
		if i > 0 && r.PC <= tab.Row(i-1).PC {
			t.Fatalf("row %d at %#x not after row %d at %#x", i, r.PC, i-1, tab.Row(i-1).PC)
		}
		got, err := tab.Lookup(r.PC)
		if r.CFA.Kind == CFANone {
			if !errors.Is(err, ErrNoFDE) {
				t.Fatalf("Lookup(%#x) of a CFANone row: %v, %v", r.PC, got, err)
			}
			continue
		}
		if err != nil || got != r {
			t.Fatalf("Lookup(%#x) = %v, %v; row %d is %v", r.PC, got, err, i, r)
		}
		if s, err := tab.FuncStart(r.PC); err != nil || s > r.PC {
			t.Fatalf("FuncStart(%#x) = %#x, %v", r.PC, s, err)
		}
	}
}

// FuzzCFI: any bytes as an .eh_frame (at address addr) or .debug_frame
// compile into a consistent table or fail with a FormatError.
func FuzzCFI(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte, addr uint64, eh bool) {
		sec := &cfiSection{name: ".debug_frame", data: data, eh: eh}
		if eh {
			sec.name, sec.addr = ".eh_frame", addr
		}
		b := bases{text: addr, data: addr, readPtr: func(a uint64) (uint64, bool) {
			if a < addr || a-addr > uint64(len(data)) || uint64(len(data))-(a-addr) < 8 {
				return 0, false
			}
			return binary.LittleEndian.Uint64(data[a-addr:]), true
		}}
		tab, err := compile([]*cfiSection{sec}, b)
		if err != nil {
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFormat) || fe.Section != sec.name {
				t.Fatalf("error %v (%T) is not a FormatError of %s", err, err, sec.name)
			}
			if fe.Offset < 0 || fe.Offset > len(data) {
				t.Fatalf("error %v at offset %#x outside the %#x-byte section", err, fe.Offset, len(data))
			}
			return
		}
		// An FDE takes at least 10 bytes: length, CIE pointer, and a
		// byte each for its start and size.
		if tab.FDEs > len(data)/10 || tab.Skipped > len(data)/10 {
			t.Fatalf("%d FDEs and %d skipped from %d bytes", tab.FDEs, tab.Skipped, len(data))
		}
		checkTable(t, tab)
	})
}

// dwarfEval evaluates the DWARF expression ops the unwinder recognises
// (DW_OP_bregN, DW_OP_deref, DW_OP_litN, and, ge, shl, plus) on a stack
// machine, independently of the classifier. ok is false for any other
// op, a stack underflow, or unreadable memory.
func dwarfEval(expr []byte, regs map[int]uint64, mem MemReader) (v uint64, ok bool) {
	var st []uint64
	pop := func() (uint64, bool) {
		if len(st) == 0 {
			return 0, false
		}
		x := st[len(st)-1]
		st = st[:len(st)-1]
		return x, true
	}
	for i := 0; i < len(expr); {
		op := expr[i]
		i++
		switch {
		case op >= 0x70 && op <= 0x8f: // DW_OP_bregN sleb128
			var off int64
			var shift uint
			for {
				if i >= len(expr) {
					return 0, false
				}
				c := expr[i]
				i++
				if shift < 64 {
					off |= int64(c&0x7f) << shift
				}
				shift += 7
				if c&0x80 == 0 {
					if shift < 64 && c&0x40 != 0 {
						off |= -1 << shift
					}
					break
				}
			}
			r, known := regs[int(op-0x70)]
			if !known {
				return 0, false
			}
			st = append(st, r+uint64(off))
		case op >= 0x30 && op <= 0x4f: // DW_OP_litN
			st = append(st, uint64(op-0x30))
		case op == 0x06: // DW_OP_deref
			a, ok := pop()
			if !ok {
				return 0, false
			}
			w, ok := readWord(mem, a)
			if !ok {
				return 0, false
			}
			st = append(st, w)
		case op == 0x1a || op == 0x2a || op == 0x24 || op == 0x22:
			y, ok1 := pop()
			x, ok2 := pop()
			if !ok1 || !ok2 {
				return 0, false
			}
			switch op {
			case 0x1a:
				st = append(st, x&y)
			case 0x2a: // signed comparison
				if int64(x) >= int64(y) {
					st = append(st, 1)
				} else {
					st = append(st, 0)
				}
			case 0x24:
				if y >= 64 {
					st = append(st, 0)
				} else {
					st = append(st, x<<y)
				}
			case 0x22:
				st = append(st, x+y)
			}
		default:
			return 0, false
		}
	}
	return pop()
}

// fuzzMem is memory of bytes at base.
type fuzzMem struct {
	base uint64
	b    []byte
}

func (m fuzzMem) ReadMemory(addr uint64, p []byte) error {
	if addr < m.base || addr-m.base > uint64(len(m.b)) || uint64(len(m.b))-(addr-m.base) < uint64(len(p)) {
		return errors.New("unmapped")
	}
	copy(p, m.b[addr-m.base:])
	return nil
}

// FuzzCFAExpression: a DWARF expression the classifier recognises as a
// CFA (the .plt form, a dereferenced register) or as where a register
// is saved (rsp+N, rbp+N) unwinds to what evaluating the expression on
// a stack machine gives.
func FuzzCFAExpression(f *testing.F) {
	stack := make([]byte, 256)
	for i := range stack {
		stack[i] = byte(i)
	}
	for _, expr := range [][]byte{
		{0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3b, 0x2a, 0x33, 0x24, 0x22}, // binutils' .plt CFA
		{0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x3a, 0x2a, 0x33, 0x24, 0x22}, // .plt with IBT
		{0x77, 0xa0, 0x01, 0x06}, // glibc's __restore_rt: CFA = [rsp+160]
		{0x76, 0x78, 0x06},       // a DRAP function: CFA = [rbp-8]
		{0x77, 0xa8, 0x01},       // __restore_rt's rip: at rsp+168
		{0x76, 0x00},             // a DRAP function's rbp: at rbp+0
	} {
		f.Add(expr, uint64(0x7ffc0000), uint64(0x7ffc0080), uint64(0x401004), stack)
	}
	f.Fuzz(func(t *testing.T, expr []byte, sp, bp, pc uint64, stack []byte) {
		mem := fuzzMem{base: sp &^ 7, b: stack}
		regs := map[int]uint64{int(RegRSP): sp, int(RegRBP): bp, int(RegRIP): pc}
		cfa := classifyCFAExpression(expr)
		rule := classifyRegExpression(expr)
		switch cfa.Kind {
		case CFAPLT, CFADeref, CFAExpression:
		default:
			t.Fatalf("CFA expression % x classified as %v", expr, cfa)
		}
		switch rule.Kind {
		case RuleAtSP, RuleAtBP, RuleExpression:
		default:
			t.Fatalf("register expression % x classified as %v", expr, rule)
		}
		cur := Regs{PC: pc, SP: sp, BP: bp}
		if cfa.Kind != CFAExpression {
			want, wantOK := dwarfEval(expr, regs, mem)
			// The return address at rsp, so that the step reads memory
			// only for the CFA itself and at a known place.
			row := Row{PC: pc, CFA: cfa, RA: Rule{Kind: RuleAtSP}, RBP: Rule{Kind: RuleSameValue}}
			_, raOK := readWord(mem, sp)
			next, ok, _ := stepCFI(row, cur, mem)
			if ok && (!wantOK || next.SP != want) {
				t.Fatalf("% x: CFA %#x from %v, evaluation gives %#x (%v)", expr, next.SP, cfa, want, wantOK)
			}
			// The unwinder declines to dereference a zero rsp or rbp.
			declined := cfa.Kind == CFADeref && regs[int(cfa.Reg)] == 0
			if !ok && wantOK && raOK && !declined {
				t.Fatalf("% x: %v not followed, evaluation gives %#x", expr, cfa, want)
			}
		}
		if rule.Kind != RuleExpression {
			addr, addrOK := dwarfEval(expr, regs, mem)
			if !addrOK {
				t.Fatalf("% x classified as %v but does not evaluate", expr, rule)
			}
			want, wantOK := readWord(mem, addr)
			row := Row{PC: pc, CFA: CFA{Kind: CFARegOffset, Reg: RegRSP, Offset: 8}, RA: rule, RBP: Rule{Kind: RuleSameValue}}
			next, ok, _ := stepCFI(row, cur, mem)
			if rule.Kind == RuleAtBP && bp == 0 {
				wantOK = false
			}
			if ok != wantOK || ok && next.PC != want {
				t.Fatalf("% x: return address %#x (%v) from %v, evaluation reads %#x (%v) at %#x", expr, next.PC, ok, rule, want, wantOK, addr)
			}
		}
	})
}

// FuzzELF: any file opens into a consistent table, or fails with an
// error that names the file. This runs the ELF checks of OpenFile, the
// relocation of CFI in objects, and the symbol reader of the cache.
func FuzzELF(f *testing.F) {
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(dir, "file")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		tab, err := Open(p)
		if err != nil {
			if !strings.HasPrefix(err.Error(), p+": ") {
				t.Fatalf("error does not name the file: %v", err)
			}
		} else {
			checkTable(t, tab)
		}
		file, err := NewCache().Open(p)
		if err != nil {
			if !strings.HasPrefix(err.Error(), p+": ") {
				t.Fatalf("cache error does not name the file: %v", err)
			}
			return
		}
		if file.Symbols != nil {
			for _, s := range file.Symbols.Symbols() {
				file.Symbols.Lookup(s.Addr)
			}
		}
	})
}
