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

// FuncFinder is implemented by Finders that know where the function
// containing a pc starts (the start of its FDE). Stack uses it to recover
// an unknown rbp where a frame's CFA is rbp-based.
type FuncFinder interface {
	FuncStart(pc uint64) (uint64, error)
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

// FuncStart implements FuncFinder.
func (f TableFinder) FuncStart(pc uint64) (uint64, error) {
	start, err := f.Table.FuncStart(pc - f.Bias)
	return start + f.Bias, err
}

// DefaultMaxFrames bounds a stack when the caller gives no limit.
const DefaultMaxFrames = 128

// Method says how a frame's caller was found.
type Method uint8

const (
	ByCFI          Method = iota + 1 // the CFI row of the pc
	ByFramePointer                   // the saved rbp chain
	// ByScan: the CFI row needs rbp, which was unknown (registers from
	// /proc/PID/task/TID/syscall), and a stack scan found the frame
	// record: a saved rbp and a return address right after a direct call
	// to the function being unwound (see FuncFinder).
	ByScan
)

func (m Method) String() string {
	switch m {
	case ByCFI:
		return "cfi"
	case ByFramePointer:
		return "fp"
	case ByScan:
		return "scan"
	}
	return "?"
}

// Stack unwinds from regs and returns the pcs of the frames, innermost
// first: regs.PC, then return addresses. Each step uses the CFI row of
// the pc (the return address minus one for callers, which is inside the
// call instruction) and falls back to the frame-pointer chain where no
// FDE covers the pc or its row is unsupported. Where the row's CFA is
// rbp-based and rbp is unknown (0), a Finder that is also a FuncFinder
// lets a validated stack scan find it first. rows may be nil (frame
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
	exact := true // cur.PC is where the thread is, not a return address
	for len(pcs) < max {
		lookup := cur.PC
		if !exact {
			lookup-- // a return address may be the first byte of the next function
		}
		exact = false
		var next Regs
		ok, end := false, false
		method := ByCFI
		if rows != nil {
			if row, err := rows.FindRow(lookup); err == nil {
				next, ok, end = stepCFI(row, cur, mem)
				exact = row.CFA.Kind == CFADeref // a saved context holds the exact pc
				if ff, isFF := rows.(FuncFinder); !ok && !end && isFF && cur.BP == 0 && needsBP(row) {
					if bp, found := scanFrameRecord(cur, lookup, mem, ff); found {
						withBP := cur
						withBP.BP = bp
						if next, ok, end = stepCFI(row, withBP, mem); ok {
							method = ByScan
						}
					}
				}
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
	case CFADeref:
		var base uint64
		switch row.CFA.Reg {
		case RegRSP:
			base = cur.SP
		case RegRBP:
			base = cur.BP
		}
		var okCFA bool
		if base == 0 {
			return Regs{}, false, false
		}
		if cfa, okCFA = readWord(mem, base+uint64(row.CFA.Offset)); !okCFA {
			return Regs{}, false, false
		}
	default:
		return Regs{}, false, false
	}
	var ra uint64
	switch row.RA.Kind {
	case RuleUndefined:
		return Regs{}, false, true
	case RuleOffset, RuleAtSP, RuleAtBP:
		at := cfa + uint64(row.RA.Offset)
		switch row.RA.Kind {
		case RuleAtSP:
			at = cur.SP + uint64(row.RA.Offset)
		case RuleAtBP:
			if cur.BP == 0 {
				return Regs{}, false, false
			}
			at = cur.BP + uint64(row.RA.Offset)
		}
		var okRA bool
		if ra, okRA = readWord(mem, at); !okRA {
			return Regs{}, false, false
		}
	default:
		return Regs{}, false, false
	}
	bp := cur.BP
	switch row.RBP.Kind {
	case RuleOffset:
		bp, _ = readWord(mem, cfa+uint64(row.RBP.Offset)) // 0 (unknown) if unreadable
	case RuleAtSP:
		bp, _ = readWord(mem, cur.SP+uint64(row.RBP.Offset))
	case RuleAtBP:
		if bp != 0 {
			bp, _ = readWord(mem, bp+uint64(row.RBP.Offset))
		}
	case RuleValOffset:
		bp = cfa + uint64(row.RBP.Offset)
	case RuleUndefined, RuleSameValue:
	default:
		bp = 0
	}
	return Regs{PC: ra, SP: cfa, BP: bp}, true, false
}

// callTarget returns the function called by the instruction that ends
// at return address ra: a direct call (e8 rel32), or a call through a
// pointer at a pc-relative address (ff 15 rel32, as in "call
// *foo@GOTPCREL(%rip)", which code built with -fno-plt and Rust's
// calls to other crates use), read from memory.
func callTarget(ra uint64, mem MemReader) (uint64, bool) {
	if ra < 6 {
		return 0, false
	}
	var call [6]byte
	if mem.ReadMemory(ra-6, call[:]) != nil {
		return 0, false
	}
	if call[1] == 0xe8 {
		return ra + uint64(int64(int32(binary.LittleEndian.Uint32(call[2:])))), true
	}
	if call[0] == 0xff && call[1] == 0x15 {
		return readWord(mem, ra+uint64(int64(int32(binary.LittleEndian.Uint32(call[2:])))))
	}
	return 0, false
}

// tailScan bounds the bytes of a called function searched for a tail
// call (see jumpsTo).
const tailScan = 32

// jumpsTo reports whether the first tailScan bytes of the function at
// target hold a jump (e9 rel32) to fn: a wrapper that tail-calls fn, such
// as Rust's StdinLock::read, which adjusts its argument and jumps to
// BufReader::read. Its caller's return address then validates a frame
// record of fn.
func jumpsTo(target, fn uint64, mem MemReader) bool {
	var code [tailScan]byte
	if mem.ReadMemory(target, code[:]) != nil {
		return false
	}
	for i := 0; i+5 <= len(code); i++ {
		if code[i] == 0xe9 && target+uint64(i)+5+uint64(int64(int32(binary.LittleEndian.Uint32(code[i+1:])))) == fn {
			return true
		}
	}
	return false
}

// needsBP reports whether a row's CFA is computed from rbp.
func needsBP(row Row) bool {
	return (row.CFA.Kind == CFARegOffset || row.CFA.Kind == CFADeref) && row.CFA.Reg == RegRBP
}

// scanWords bounds the stack scan for a frame record: 4 KiB above SP.
const scanWords = 512

// scanFrameRecord finds the rbp of a frame whose function keeps a frame
// pointer when the register is unknown: the lowest 8-aligned address a
// at or above SP where [a+8] is a return address right after a call to
// the function containing pc (direct, or through a pc-relative pointer
// such as a GOT slot: see callTarget), or to a wrapper that jumps to it
// (see jumpsTo); [a] is then the saved rbp, whatever the caller kept
// there. (A function that realigns its stack copies its return address
// to [rbp+8], below the original: the lowest match is its frame record.)
// Calls through a register or a PLT stub, and tail calls deeper than one
// wrapper, do not validate, and the unwind ends there as it would
// without the scan.
func scanFrameRecord(cur Regs, pc uint64, mem MemReader, ff FuncFinder) (uint64, bool) {
	fn, err := ff.FuncStart(pc)
	if err != nil {
		return 0, false
	}
	for a := (cur.SP + 7) &^ 7; a < cur.SP+scanWords*8; a += 8 {
		ra, ok := readWord(mem, a+8)
		if !ok {
			return 0, false
		}
		target, ok := callTarget(ra, mem)
		if !ok {
			continue
		}
		if start, err := ff.FuncStart(target); err == nil && (start == fn || jumpsTo(target, fn, mem)) {
			return a, true
		}
	}
	return 0, false
}
