package cfg

import (
	"fmt"
	"strings"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/kernel"
)

// LiveSet is a set of the 16 general-purpose registers (bits 0–15, in
// encoding order RAX RCX RDX RBX RSP RBP RSI RDI R8–R15) and the six
// arithmetic flags (bits 16–21).
type LiveSet uint32

const (
	regRAX LiveSet = 1 << iota
	regRCX
	regRDX
	regRBX
	regRSP
	regRBP
	regRSI
	regRDI
	regR8
	regR9
	regR10
	regR11
	regR12
	regR13
	regR14
	regR15

	allRegs LiveSet = 0xffff
	// FlagBits is every arithmetic flag, as a LiveSet.
	FlagBits LiveSet = LiveSet(AllFlags) << 16
	// Everything: what unknown semantics are assumed to read.
	allLive = allRegs | FlagBits
)

// SysV / kernel ABI sets.
const (
	argRegs     = regRDI | regRSI | regRDX | regRCX | regR8 | regR9
	callerSaved = regRAX | regRCX | regRDX | regRSI | regRDI | regR8 | regR9 | regR10 | regR11
	calleeSaved = regRBX | regRBP | regR12 | regR13 | regR14 | regR15
	retRegs     = regRAX | regRDX
)

var regNames = [16]string{"RAX", "RCX", "RDX", "RBX", "RSP", "RBP", "RSI", "RDI",
	"R8", "R9", "R10", "R11", "R12", "R13", "R14", "R15"}

// Flags is the flag part of the set.
func (s LiveSet) Flags() Flag { return Flag(s >> 16) }

// Names lists the members: registers, then flags.
func (s LiveSet) Names() []string {
	var n []string
	for i, name := range regNames {
		if s&(1<<i) != 0 {
			n = append(n, name)
		}
	}
	return append(n, s.Flags().Names()...)
}

func (s LiveSet) String() string { return strings.Join(s.Names(), " ") }

func flags(f Flag) LiveSet { return LiveSet(f) << 16 }

// gpr maps an x86asm register to its GPR bit and whether writing it
// replaces the whole register (32- and 64-bit writes do; 8- and 16-bit
// writes merge, so they also read it).
func gpr(r x86asm.Reg) (bit LiveSet, full bool, ok bool) {
	switch {
	case r >= x86asm.AL && r <= x86asm.BL:
		return 1 << (r - x86asm.AL), false, true
	case r >= x86asm.AH && r <= x86asm.BH:
		return 1 << (r - x86asm.AH), false, true
	case r >= x86asm.SPB && r <= x86asm.R15B:
		return 1 << (r - x86asm.SPB + 4), false, true
	case r >= x86asm.AX && r <= x86asm.R15W:
		return 1 << (r - x86asm.AX), false, true
	case r >= x86asm.EAX && r <= x86asm.R15L:
		return 1 << (r - x86asm.EAX), true, true
	case r >= x86asm.RAX && r <= x86asm.R15:
		return 1 << (r - x86asm.RAX), true, true
	}
	return 0, false, false
}

// memUses is what addressing an operand reads.
func memUses(a x86asm.Arg) LiveSet {
	m, ok := a.(x86asm.Mem)
	if !ok {
		return 0
	}
	var s LiveSet
	for _, r := range []x86asm.Reg{m.Base, m.Index} {
		if b, _, ok := gpr(r); ok {
			s |= b
		}
	}
	return s
}

// argUse is what reading operand a reads.
func argUse(a x86asm.Arg) LiveSet {
	if r, ok := a.(x86asm.Reg); ok {
		b, _, _ := gpr(r)
		return b
	}
	return memUses(a)
}

// destDef: writing operand a defines (kills) def and reads use (partial
// register writes, and the address of a memory destination).
func destDef(a x86asm.Arg) (use, def LiveSet) {
	if r, ok := a.(x86asm.Reg); ok {
		b, full, _ := gpr(r)
		if full {
			return 0, b
		}
		return b, b
	}
	return memUses(a), 0
}

// opKind classifies operations by how they use their explicit operands.
type opKind int

const (
	opUnknown  opKind = iota
	opMove            // dst = f(src…): dst written, not read
	opRMW             // dst = dst op src…
	opRead            // every operand read (cmp, test, bt)
	opExchange        // both operands read and written
	opNop
)

var opKinds = map[x86asm.Op]opKind{
	x86asm.MOV: opMove, x86asm.MOVZX: opMove, x86asm.MOVSX: opMove, x86asm.MOVSXD: opMove,
	x86asm.LEA: opMove, x86asm.MOVQ: opMove, x86asm.MOVD: opMove, x86asm.POPCNT: opMove,
	x86asm.LZCNT: opMove, x86asm.TZCNT: opMove, x86asm.BSF: opRMW, x86asm.BSR: opRMW,
	x86asm.SETA: opMove, x86asm.SETAE: opMove, x86asm.SETB: opMove, x86asm.SETBE: opMove,
	x86asm.SETE: opMove, x86asm.SETNE: opMove, x86asm.SETG: opMove, x86asm.SETGE: opMove,
	x86asm.SETL: opMove, x86asm.SETLE: opMove, x86asm.SETO: opMove, x86asm.SETNO: opMove,
	x86asm.SETP: opMove, x86asm.SETNP: opMove, x86asm.SETS: opMove, x86asm.SETNS: opMove,
	x86asm.CMOVA: opRMW, x86asm.CMOVAE: opRMW, x86asm.CMOVB: opRMW, x86asm.CMOVBE: opRMW,
	x86asm.CMOVE: opRMW, x86asm.CMOVNE: opRMW, x86asm.CMOVG: opRMW, x86asm.CMOVGE: opRMW,
	x86asm.CMOVL: opRMW, x86asm.CMOVLE: opRMW, x86asm.CMOVO: opRMW, x86asm.CMOVNO: opRMW,
	x86asm.CMOVP: opRMW, x86asm.CMOVNP: opRMW, x86asm.CMOVS: opRMW, x86asm.CMOVNS: opRMW,
	x86asm.ADD: opRMW, x86asm.SUB: opRMW, x86asm.AND: opRMW, x86asm.OR: opRMW, x86asm.XOR: opRMW,
	x86asm.ADC: opRMW, x86asm.SBB: opRMW, x86asm.INC: opRMW, x86asm.DEC: opRMW, x86asm.NEG: opRMW,
	x86asm.NOT: opRMW, x86asm.SHL: opRMW, x86asm.SHR: opRMW, x86asm.SAR: opRMW, x86asm.ROL: opRMW,
	x86asm.ROR: opRMW, x86asm.BTS: opRMW, x86asm.BTR: opRMW, x86asm.BTC: opRMW, x86asm.BSWAP: opRMW,
	x86asm.CMP: opRead, x86asm.TEST: opRead, x86asm.BT: opRead,
	x86asm.XCHG: opExchange, x86asm.XADD: opExchange,
	x86asm.NOP: opNop, x86asm.PREFETCHT0: opRead, x86asm.PREFETCHNTA: opRead, x86asm.PREFETCHW: opRead,
}

// readsCondition reports setcc and cmovcc, which read flags.
func readsCondition(op x86asm.Op) bool {
	s := op.String()
	return strings.HasPrefix(s, "SET") || strings.HasPrefix(s, "CMOV")
}

// isJcc reports the conditional jumps.
func isJcc(op x86asm.Op) bool {
	switch op {
	case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JNE, x86asm.JG, x86asm.JGE,
		x86asm.JL, x86asm.JLE, x86asm.JO, x86asm.JNO, x86asm.JP, x86asm.JNP, x86asm.JS, x86asm.JNS:
		return true
	}
	return false
}

// useDef returns what instruction in reads before it writes anything (use)
// and what it overwrites entirely (def). Calls follow the kernel's SysV
// ABI; anything not understood reads everything and defines nothing.
func useDef(in *Instruction, names NameAt, protos kernel.Prototypes, reads CalleeReads) (use, def LiveSet) {
	inst := &in.Inst
	args := inst.Args[:]
	n := 0
	for n < len(args) && args[n] != nil {
		n++
	}
	args = args[:n]
	var fl flagEffect
	if e, ok := flagEffects[inst.Op]; ok {
		fl = e
	} else if r, w, ok := shiftEffect(in); ok {
		fl = flagEffect{reads: r, writes: w}
	}
	flagUse, flagDef := flags(fl.reads), flags(fl.writes)

	switch op := inst.Op; {
	case op == x86asm.CALL:
		use = argRegs | regRSP
		if t, ok := BranchTarget(in); ok && names != nil {
			name, named := names(t)
			switch {
			case named && IsIndirectThunk(name):
				use |= thunkReg(name)
			case reads[t] != 0:
				// What the callee reads before writing, plus its
				// prototype's arguments where it has one: a tracer
				// attached at its entry (fentry, kprobe) may read those
				// even when the callee does not.
				use = reads[t]&callerSaved | regRSP
				if _, ok := protos[name]; named && ok {
					use |= argSet(protos, name)
				}
			case named:
				use = argSet(protos, name) | regRSP
			}
		} else {
			for _, a := range args {
				use |= argUse(a)
			}
		}
		return use, callerSaved | flags(AllFlags)
	case op == x86asm.RET:
		return retRegs | calleeSaved | regRSP, 0
	case op == x86asm.JMP:
		// What happens after the jump (an exit, a table's targets, or
		// anything at all for an unresolved one) is the block's out set;
		// the jump itself reads its operand, or a retpoline thunk's
		// register.
		if _, direct := BranchTarget(in); !direct {
			return argUse(args[0]), 0
		}
		return regOf(in, names), 0
	case isJcc(op):
		return flags(AllFlags), 0
	case op == x86asm.PUSH:
		return argUse(args[0]) | regRSP, 0
	case op == x86asm.POP:
		u, d := destDef(args[0])
		return u | regRSP, d
	case op == x86asm.LEAVE:
		return regRBP, regRBP
	case op == x86asm.CQO || op == x86asm.CDQ:
		return regRAX, regRDX
	case op == x86asm.RDTSC:
		return 0, regRAX | regRDX
	case op == x86asm.RDTSCP:
		return 0, regRAX | regRDX | regRCX
	case op == x86asm.CDQE:
		return regRAX, regRAX
	case op == x86asm.RDTSC:
		return 0, regRAX | regRDX
	case op == x86asm.CMPXCHG:
		// RAX is written only when the compare fails: not a definite
		// write, so it stays live through.
		u, _ := destDef(args[0])
		return regRAX | argUse(args[1]) | u | argUse(args[0]), flagDef
	case (op == x86asm.MUL || op == x86asm.DIV || op == x86asm.IDIV || (op == x86asm.IMUL && n == 1)):
		return regRAX | regRDX | argUse(args[0]), regRAX | regRDX | flags(AllFlags)
	case op == x86asm.STOSB || op == x86asm.STOSW || op == x86asm.STOSD || op == x86asm.STOSQ:
		// RCX counts only under rep, so it is read but never a definite
		// write.
		return regRAX | regRDI | regRCX, regRDI
	case op == x86asm.MOVSB || op == x86asm.MOVSW || op == x86asm.MOVSD || op == x86asm.MOVSQ:
		if n > 0 { // movsd the SSE move, not the string one
			break
		}
		return regRSI | regRDI | regRCX, regRSI | regRDI
	}
	if readsCondition(inst.Op) {
		flagUse = flags(AllFlags)
	}
	kind, ok := opKinds[inst.Op]
	if !ok {
		return allLive, 0
	}
	switch kind {
	case opNop:
		return flagUse, 0
	case opRead:
		for _, a := range args {
			use |= argUse(a)
		}
		return use | flagUse, flagDef
	case opMove:
		u, d := destDef(args[0])
		use = u
		for _, a := range args[1:] {
			use |= argUse(a)
		}
		if inst.Op == x86asm.LEA {
			use = u | memUses(args[1])
		}
		return use | flagUse, d | flagDef
	case opRMW:
		u, d := destDef(args[0])
		use = u | argUse(args[0])
		for _, a := range args[1:] {
			use |= argUse(a)
		}
		// xor %eax,%eax and sub %eax,%eax set a register to zero
		// without reading it. xor %al,%al zeroes only the low byte: the
		// rest of RAX is kept, so it is still read (u).
		if (inst.Op == x86asm.XOR || inst.Op == x86asm.SUB) && n == 2 && args[0] == args[1] {
			use = u
		}
		if _, isShift := shiftEffectOp(inst.Op); isShift && n == 2 {
			if r, ok := args[1].(x86asm.Reg); ok && r == x86asm.CL {
				use |= regRCX
			}
		}
		return use | flagUse, d | flagDef
	case opExchange:
		for _, a := range args {
			u, d := destDef(a)
			use |= u | argUse(a)
			def |= d
		}
		return use | flagUse, def | flagDef
	}
	return allLive, 0
}

func shiftEffectOp(op x86asm.Op) (struct{}, bool) {
	switch op {
	case x86asm.SHL, x86asm.SHR, x86asm.SAR, x86asm.ROL, x86asm.ROR:
		return struct{}{}, true
	}
	return struct{}{}, false
}

// thunkReg is the register a retpoline thunk jumps through.
func thunkReg(name string) LiveSet {
	suffix := strings.ToUpper(name[strings.LastIndexByte(name, '_')+1:])
	for i, n := range regNames {
		if n == suffix {
			return 1 << i
		}
	}
	return allRegs
}

// Liveness is the result of the backward data-flow over one function:
// what is live on entry to each block.
type Liveness struct {
	fn      *Function
	blocks  []Block
	names   NameAt
	protos  kernel.Prototypes
	reads   CalleeReads
	abi     ABI
	LiveIn  []LiveSet // per block
	LiveOut []LiveSet // per block
}

// ABI is what a function's callers may assume of it, and it of its
// callees, about the registers a call leaves alone.
type ABI uint8

const (
	// SysV: a call may overwrite every caller-saved register, so a
	// return need leave only the return and callee-saved registers as
	// they were. The kernel's functions: it is built with -pg (ftrace's
	// __fentry__ call), which turns GCC's -fipa-ra off.
	SysV ABI = iota
	// CallersKnow: a caller may keep a value in any register its callee
	// is known not to write, across the call (GCC's interprocedural
	// register allocation, -fipa-ra, on from -O2 for every callee whose
	// code the compiler sees bind locally: an executable's functions, a
	// library's static and hidden ones). A return therefore reads every
	// register, and a call writes none of them (only the flags, which
	// GCC does not keep across a call), which is what a program's or a
	// library's text must be analysed with: `gcc -O2` keeps a caller's
	// %ecx across a call to a static function that leaves %rcx alone.
	CallersKnow
)

// exitUses is what a block that leaves the function reads at its end.
func (lv *Liveness) exitUses(b *Block) LiveSet {
	var callers LiveSet // what the callers may keep in registers
	if lv.abi == CallersKnow {
		callers = allRegs
	}
	switch b.Exit {
	case Return:
		return retSet(lv.protos, lv.fn.Name) | calleeSaved | regRSP | callers
	case NoReturnCall:
		// The call itself (the block's last instruction) reads its
		// arguments; nothing after it runs.
		return 0
	case TailCall:
		args := argRegs
		if t, ok := BranchTarget(b.Last(lv.fn)); ok {
			if name, ok := lv.names.name(t); ok {
				args = argSet(lv.protos, name)
			}
			if r := lv.reads[t]; r != 0 {
				name, named := lv.names.name(t)
				if _, ok := lv.protos[name]; named && ok {
					args = r&callerSaved | argSet(lv.protos, name)
				} else {
					args = r & callerSaved
				}
			}
		}
		return args | calleeSaved | regRSP | callers
	}
	return allLive // indirect jump, trap: assume anything
}

// useDef is the instruction's uses and definitions under lv's ABI.
func (lv *Liveness) useDef(in *Instruction) (use, def LiveSet) {
	use, def = useDef(in, lv.names, lv.protos, lv.reads)
	if lv.abi == CallersKnow && in.Inst.Op == x86asm.CALL {
		def &= FlagBits // the callee may leave any register as it was
	}
	return use, def
}

// Live computes liveness of registers and flags over f's blocks,
// iterating to a fixed point. A call reads its argument registers (per
// its BTF prototype in protos, else all six) and clobbers the
// caller-saved ones; a return reads the return registers (none for a
// void function) and the callee-saved ones. protos may be nil.
func (f *Function) Live(blocks []Block, names NameAt, protos kernel.Prototypes) *Liveness {
	return f.LiveWith(blocks, names, protos, nil)
}

// CalleeReads maps a function's start address to what it may read before
// writing it (its entry live-in), from a whole-kernel pass: the callee
// summaries that make call sites precise where they are known.
type CalleeReads map[uint64]LiveSet

// LiveWith is Live with callee summaries; reads may be nil.
func (f *Function) LiveWith(blocks []Block, names NameAt, protos kernel.Prototypes, reads CalleeReads) *Liveness {
	return f.LiveABI(blocks, names, protos, reads, SysV)
}

// LiveABI is LiveWith under abi.
func (f *Function) LiveABI(blocks []Block, names NameAt, protos kernel.Prototypes, reads CalleeReads, abi ABI) *Liveness {
	lv := &Liveness{fn: f, blocks: blocks, names: names, protos: protos, reads: reads, abi: abi,
		LiveIn: make([]LiveSet, len(blocks)), LiveOut: make([]LiveSet, len(blocks))}
	type ud struct{ use, def LiveSet }
	summary := make([]ud, len(blocks))
	for bi := range blocks {
		b := &blocks[bi]
		var s ud
		for i := b.First + b.N - 1; i >= b.First; i-- {
			u, d := lv.useDef(&f.Insns[i])
			s.use = u | (s.use &^ d)
			s.def |= d
		}
		summary[bi] = s
	}
	for changed := true; changed; {
		changed = false
		for bi := len(blocks) - 1; bi >= 0; bi-- {
			b := &blocks[bi]
			var out LiveSet
			if b.Exit != NoExit {
				out = lv.exitUses(b)
			}
			if len(b.Succs) == 0 && b.Exit == NoExit {
				out = allLive // falls off the end of what was decoded
			}
			for _, e := range b.Succs {
				out |= lv.LiveIn[e.To]
			}
			in := summary[bi].use | (out &^ summary[bi].def)
			if in != lv.LiveIn[bi] || out != lv.LiveOut[bi] {
				lv.LiveIn[bi], lv.LiveOut[bi] = in, out
				changed = true
			}
		}
	}
	return lv
}

// Before returns what is live just before instruction i of block b.
func (lv *Liveness) Before(b, i int) LiveSet {
	blk := &lv.blocks[b]
	live := lv.LiveOut[b]
	for j := blk.First + blk.N - 1; j >= i; j-- {
		u, d := lv.useDef(&lv.fn.Insns[j])
		live = u | (live &^ d)
	}
	return live
}

// Clobbers returns what the instruction sequence code (placed at addr)
// overwrites that was not saved and restored within it: the writes of a
// patch's instrumentation before it runs the relocated original. A
// pushfq … popfq pair restores the flags; push/pop of a register restores
// it. Instructions it does not understand clobber everything.
func Clobbers(code []byte, addr uint64) (LiveSet, error) {
	if len(code) == 0 {
		return 0, fmt.Errorf("patch at %#x: no decodable instruction", addr)
	}
	var clobbered, savedFlags LiveSet
	var stack []LiveSet // registers pushed, innermost last
	// One instruction at a time, not a Function: this runs for every
	// patch, half a million in a whole-kernel session.
	for off := 0; off < len(code); {
		inst, err := decodeInst(code[off:])
		if err != nil || inst.Op == 0 {
			if off == 0 {
				return 0, fmt.Errorf("patch at %#x: no decodable instruction", addr)
			}
			return allLive, nil
		}
		in := &Instruction{Addr: addr + uint64(off), Bytes: code[off : off+inst.Len : off+inst.Len], Inst: inst}
		off += inst.Len
		switch in.Inst.Op {
		case x86asm.PUSHFQ, x86asm.PUSHF:
			savedFlags = clobbered & FlagBits
			continue
		case x86asm.POPFQ, x86asm.POPF:
			clobbered = clobbered&^FlagBits | savedFlags
			continue
		case x86asm.PUSH:
			if r, ok := in.Inst.Args[0].(x86asm.Reg); ok {
				b, _, _ := gpr(r)
				stack = append(stack, b)
				continue
			}
		case x86asm.POP:
			if r, ok := in.Inst.Args[0].(x86asm.Reg); ok && len(stack) > 0 {
				b, _, _ := gpr(r)
				if stack[len(stack)-1] == b {
					stack = stack[:len(stack)-1]
					clobbered &^= b
					continue
				}
			}
		}
		u, d := useDef(in, nil, nil, nil)
		if u == allLive && d == 0 && in.Inst.Op != x86asm.NOP {
			return allLive, nil // not understood
		}
		// A partial register write reads and writes it: count the write.
		clobbered |= d | writesOf(in)
	}
	return clobbered, nil
}

// writesOf adds the registers an instruction writes only in part (8/16-
// bit destinations), which useDef reports as uses.
func writesOf(in *Instruction) LiveSet {
	if in.Inst.Args[0] == nil {
		return 0
	}
	kind, ok := opKinds[in.Inst.Op]
	if !ok || kind == opRead || kind == opNop {
		return 0
	}
	if r, ok := in.Inst.Args[0].(x86asm.Reg); ok {
		b, _, _ := gpr(r)
		return b
	}
	return 0
}

// name is a nil-safe lookup.
func (n NameAt) name(a uint64) (string, bool) {
	if n == nil {
		return "", false
	}
	return n(a)
}
