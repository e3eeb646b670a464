package unwind

import (
	"encoding/binary"
)

// Regs are the registers an unwind starts from. BP 0 means unknown (the
// /proc/PID/task/TID/syscall view of a blocked thread gives only SP and
// PC); CFI rows that restore rbp make it known again.
type Regs struct{ PC, SP, BP uint64 }

// MemReader reads the memory of the process being unwound.
type MemReader interface {
	ReadMemory(addr uint64, p []byte) error
}

// Finder returns the unwind row in effect at a runtime pc: a Process, or
// a single Table through TableFinder.
type Finder interface {
	FindRow(pc uint64) (Row, error)
}

// TableFinder finds rows in one table whose file is loaded Bias bytes
// above its link-time addresses.
type TableFinder struct {
	Table *Table
	Bias  uint64
}

// FindRow implements Finder.
func (f TableFinder) FindRow(pc uint64) (Row, error) {
	r, err := f.Table.Lookup(pc - f.Bias)
	r.PC += f.Bias
	return r, err
}

// DefaultMaxFrames bounds a stack when the caller gives no limit.
const DefaultMaxFrames = 128

// Method says how a frame's caller was found.
type Method uint8

const (
	ByCFI          Method = iota + 1 // the CFI row of the pc
	ByFramePointer                   // the saved rbp chain
)

func (m Method) String() string {
	switch m {
	case ByCFI:
		return "cfi"
	case ByFramePointer:
		return "fp"
	}
	return "?"
}

// Stack unwinds from regs and returns the pcs of the frames, innermost
// first: regs.PC, then return addresses. Each step uses the CFI row of
// the pc (the return address minus one for callers, which is inside the
// call instruction) and falls back to the frame-pointer chain where no
// FDE covers the pc or its row is unsupported. rows may be nil (frame
// pointers only). max ≤ 0 means DefaultMaxFrames.
func Stack(regs Regs, mem MemReader, rows Finder, max int) []uint64 {
	pcs, _ := StackMethods(regs, mem, rows, max)
	return pcs
}

// StackMethods is Stack that also says how each caller was found:
// methods[i] is how pcs[i+1] was found.
func StackMethods(regs Regs, mem MemReader, rows Finder, max int) (pcs []uint64, methods []Method) {
	if max <= 0 {
		max = DefaultMaxFrames
	}
	if regs.PC == 0 {
		return nil, nil
	}
	pcs = append(pcs, regs.PC)
	cur := regs
	for len(pcs) < max {
		lookup := cur.PC
		if len(pcs) > 1 {
			lookup-- // a return address may be the first byte of the next function
		}
		var next Regs
		ok, end := false, false
		method := ByCFI
		if rows != nil {
			if row, err := rows.FindRow(lookup); err == nil {
				next, ok, end = stepCFI(row, cur, mem)
			}
		}
		if end {
			break
		}
		if !ok {
			method = ByFramePointer
			if next, ok = stepFP(cur, mem); !ok {
				break
			}
		}
		if next.PC == 0 || next.SP <= cur.SP {
			break // the end of the stack, or a loop
		}
		pcs = append(pcs, next.PC)
		methods = append(methods, method)
		cur = next
	}
	return pcs, methods
}

// FramePointers unwinds by the saved-rbp chain alone: [rbp] is the
// caller's rbp and [rbp+8] the return address. A frame whose function
// does not keep a frame pointer loses its caller.
func FramePointers(regs Regs, mem MemReader, max int) []uint64 {
	if max <= 0 {
		max = DefaultMaxFrames
	}
	if regs.PC == 0 {
		return nil
	}
	pcs := []uint64{regs.PC}
	cur := regs
	for len(pcs) < max {
		next, ok := stepFP(cur, mem)
		if !ok || next.PC == 0 || next.SP <= cur.SP {
			break
		}
		pcs = append(pcs, next.PC)
		cur = next
	}
	return pcs
}

func readWord(mem MemReader, addr uint64) (uint64, bool) {
	var b [8]byte
	if err := mem.ReadMemory(addr, b[:]); err != nil {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b[:]), true
}

// stepFP finds the caller through the frame pointer.
func stepFP(cur Regs, mem MemReader) (Regs, bool) {
	bp := cur.BP
	if bp == 0 || bp&7 != 0 || bp < cur.SP {
		return Regs{}, false
	}
	savedBP, ok1 := readWord(mem, bp)
	ra, ok2 := readWord(mem, bp+8)
	if !ok1 || !ok2 {
		return Regs{}, false
	}
	return Regs{PC: ra, SP: bp + 16, BP: savedBP}, true
}

// stepCFI applies a row. ok false: the row cannot be followed (fall back
// to frame pointers); end true: the row marks the outermost frame.
func stepCFI(row Row, cur Regs, mem MemReader) (next Regs, ok, end bool) {
	var cfa uint64
	switch row.CFA.Kind {
	case CFARegOffset:
		switch row.CFA.Reg {
		case RegRSP:
			cfa = cur.SP + uint64(row.CFA.Offset)
		case RegRBP:
			if cur.BP == 0 {
				return Regs{}, false, false
			}
			cfa = cur.BP + uint64(row.CFA.Offset)
		default:
			return Regs{}, false, false
		}
	case CFAPLT:
		cfa = cur.SP + uint64(row.CFA.Offset)
		if cur.PC&15 >= uint64(row.CFA.Threshold) {
			cfa += 8
		}
	default:
		return Regs{}, false, false
	}
	var ra uint64
	switch row.RA.Kind {
	case RuleUndefined:
		return Regs{}, false, true
	case RuleOffset:
		var okRA bool
		if ra, okRA = readWord(mem, cfa+uint64(row.RA.Offset)); !okRA {
			return Regs{}, false, false
		}
	default:
		return Regs{}, false, false
	}
	bp := cur.BP
	switch row.RBP.Kind {
	case RuleOffset:
		bp, _ = readWord(mem, cfa+uint64(row.RBP.Offset)) // 0 (unknown) if unreadable
	case RuleValOffset:
		bp = cfa + uint64(row.RBP.Offset)
	case RuleUndefined, RuleSameValue:
	default:
		bp = 0
	}
	return Regs{PC: ra, SP: cfa, BP: bp}, true, false
}
