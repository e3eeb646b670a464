package cfg

import "golang.org/x/arch/x86/x86asm"

// Flag is a set of the arithmetic flags of RFLAGS.
type Flag uint8

const (
	CF Flag = 1 << iota
	PF
	AF
	ZF
	SF
	OF

	AllFlags = CF | PF | AF | ZF | SF | OF
)

// flagEffect says which flags an operation reads and which it writes
// (defined or undefined: nobody may rely on an undefined flag, so it counts
// as written).
type flagEffect struct{ reads, writes Flag }

// flagEffects lists the operations the scan understands. An operation not
// listed stops the scan with "live": unknown semantics are treated as
// reading everything.
var flagEffects = map[x86asm.Op]flagEffect{
	// No effect on flags.
	x86asm.MOV: {}, x86asm.MOVZX: {}, x86asm.MOVSX: {}, x86asm.MOVSXD: {},
	x86asm.LEA: {}, x86asm.PUSH: {}, x86asm.POP: {}, x86asm.NOP: {},
	x86asm.XCHG: {}, x86asm.NOT: {}, x86asm.BSWAP: {}, x86asm.CDQE: {}, x86asm.CQO: {},
	x86asm.CDQ: {}, x86asm.CWDE: {}, x86asm.PREFETCHT0: {},
	x86asm.PREFETCHNTA: {}, x86asm.PREFETCHW: {}, x86asm.MOVAPS: {}, x86asm.MOVUPS: {},
	x86asm.MOVQ: {}, x86asm.MOVD: {}, x86asm.MOVNTI: {},

	// Write every arithmetic flag.
	x86asm.ADD: {writes: AllFlags}, x86asm.SUB: {writes: AllFlags}, x86asm.CMP: {writes: AllFlags},
	x86asm.AND: {writes: AllFlags}, x86asm.OR: {writes: AllFlags}, x86asm.XOR: {writes: AllFlags},
	x86asm.TEST: {writes: AllFlags}, x86asm.NEG: {writes: AllFlags}, x86asm.XADD: {writes: AllFlags},
	x86asm.CMPXCHG: {writes: AllFlags}, x86asm.IMUL: {writes: AllFlags}, x86asm.MUL: {writes: AllFlags},
	x86asm.BSF: {writes: AllFlags}, x86asm.BSR: {writes: AllFlags}, x86asm.POPCNT: {writes: AllFlags},
	x86asm.TZCNT: {writes: AllFlags}, x86asm.LZCNT: {writes: AllFlags},
	x86asm.BT: {writes: AllFlags}, x86asm.BTS: {writes: AllFlags}, x86asm.BTR: {writes: AllFlags},
	x86asm.BTC: {writes: AllFlags},

	// Write all but CF.
	x86asm.INC: {writes: AllFlags &^ CF}, x86asm.DEC: {writes: AllFlags &^ CF},

	// Read flags.
	x86asm.ADC: {reads: CF, writes: AllFlags}, x86asm.SBB: {reads: CF, writes: AllFlags},
	x86asm.PUSHF: {reads: AllFlags}, x86asm.PUSHFQ: {reads: AllFlags}, x86asm.LAHF: {reads: AllFlags},
}

// FlagsLive reports whether any arithmetic flag may be live just before
// instruction i, that is, whether a patch inserted there must preserve
// RFLAGS.
func (f *Function) FlagsLive(i int) bool { return f.FlagsLiveIn(i) != 0 }

// FlagsLiveIn returns the flags that may be live just before instruction
// i. It scans forward through straight-line code: a flag is live if it is
// read before it is written; once every flag is written the rest cannot
// matter. Any control transfer or unknown operation ends the scan with the
// flags still undecided counted live, so the answer errs on the side of
// saving flags.
func (f *Function) FlagsLiveIn(i int) Flag {
	pending := AllFlags // not yet read or written
	var live Flag
	for ; i < len(f.Insns); i++ {
		in := &f.Insns[i]
		if IsControlTransfer(in) {
			return live | pending
		}
		eff, ok := flagEffects[in.Inst.Op]
		if !ok {
			if r, w, ok := shiftEffect(in); ok {
				eff = flagEffect{reads: r, writes: w}
			} else {
				return live | pending
			}
		}
		live |= eff.reads & pending
		pending &^= eff.reads | eff.writes
		if pending == 0 {
			return live
		}
	}
	return live | pending
}

// Names lists the flags in the set, e.g. ["CF", "ZF"].
func (fl Flag) Names() []string {
	var n []string
	for i, name := range []string{"CF", "PF", "AF", "ZF", "SF", "OF"} {
		if fl&(1<<i) != 0 {
			n = append(n, name)
		}
	}
	return n
}

// shiftEffect handles shifts by an immediate count: a count of zero leaves
// the flags alone (so they stay pending); any other count writes all of
// them. A shift by %cl may or may not write them, so it is not understood.
func shiftEffect(in *Instruction) (reads, writes Flag, ok bool) {
	switch in.Inst.Op {
	case x86asm.SHL, x86asm.SHR, x86asm.SAR:
	default:
		return 0, 0, false
	}
	if len(in.Inst.Args) < 2 {
		return 0, 0, false
	}
	n, isImm := in.Inst.Args[1].(x86asm.Imm)
	if !isImm {
		return 0, 0, false
	}
	if n == 0 {
		return 0, 0, true
	}
	return 0, AllFlags, true
}
