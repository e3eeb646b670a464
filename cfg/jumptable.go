package cfg

import (
	"encoding/binary"

	"golang.org/x/arch/x86/x86asm"
)

// maxTableEntries bounds a jump table we are willing to believe.
const maxTableEntries = 4096

// sliceWindow is how far back the slice looks for the table's base and
// bound.
const sliceWindow = 12

// JumpTable is a resolved indirect jump: its table and the targets.
type JumpTable struct {
	Jump    uint64   // address of the indirect jump
	Table   uint64   // address of the table
	Targets []uint64 // one per entry, in table order
}

// jumpTable resolves the indirect jump at f.Insns[j] by a backward slice
// on the jump's register, for the two shapes compilers emit:
//
//	cmp $N,%eX ; ja default ; … ; jmp *TABLE(,%rX,8)            (absolute)
//	cmp $N,%eX ; ja default ; lea TABLE(%rip),%rB ;
//	    movslq (%rB,%rX,4),%rY ; add %rB,%rY ; jmp *%rY           (relative)
//
// The bound comes from the compare that guards the index. Every target
// must lie inside the function. ok is false for any other jump.
func (f *Function) jumpTable(j int, r TextReader, names NameAt) (JumpTable, bool) {
	if r == nil {
		return JumpTable{}, false
	}
	jmp := &f.Insns[j]
	jt := JumpTable{Jump: jmp.Addr}
	var index LiveSet
	var scale int
	relative := false
	var base LiveSet
	switch a := jmp.Inst.Args[0].(type) {
	case x86asm.Mem: // jmp *TABLE(,%rX,8)
		if a.Base != 0 || a.Scale != 8 {
			return jt, false
		}
		index, _, _ = gpr(a.Index)
		jt.Table, scale = uint64(int64(int32(a.Disp))), 8
	default:
		target := regOf(jmp, names)
		if target == 0 {
			return jt, false
		}
		// Walk back: add %rB,%rY ; movslq (%rB,%rX,4),%rY ; lea T(%rip),%rB
		i := j - 1
		if i < 0 || f.Insns[i].Inst.Op != x86asm.ADD {
			return jt, false
		}
		if dst, _, _ := gpr(regArg(f.Insns[i].Inst.Args[0])); dst != target {
			return jt, false
		}
		base, _, _ = gpr(regArg(f.Insns[i].Inst.Args[1]))
		i--
		if i < 0 || f.Insns[i].Inst.Op != x86asm.MOVSXD {
			return jt, false
		}
		m, ok := f.Insns[i].Inst.Args[1].(x86asm.Mem)
		if !ok || m.Scale != 4 {
			return jt, false
		}
		if b, _, _ := gpr(m.Base); b != base {
			return jt, false
		}
		index, _, _ = gpr(m.Index)
		for i--; i >= 0 && i > j-sliceWindow; i-- {
			in := &f.Insns[i]
			if in.Inst.Op == x86asm.LEA {
				if d, _, _ := gpr(regArg(in.Inst.Args[0])); d == base {
					lm, ok := in.Inst.Args[1].(x86asm.Mem)
					if !ok || lm.Base != x86asm.RIP {
						return jt, false
					}
					jt.Table = in.End() + uint64(int64(int32(lm.Disp)))
					break
				}
			}
		}
		if jt.Table == 0 {
			return jt, false
		}
		scale, relative = 4, true
	}
	if index == 0 {
		return jt, false
	}
	n, ok := f.indexBound(j, index)
	if !ok || n <= 0 || n > maxTableEntries {
		return jt, false
	}
	buf := make([]byte, n*scale)
	if r.Read(jt.Table, buf) != nil {
		return jt, false
	}
	for e := 0; e < n; e++ {
		var t uint64
		if relative {
			t = jt.Table + uint64(int64(int32(binary.LittleEndian.Uint32(buf[e*4:]))))
		} else {
			t = binary.LittleEndian.Uint64(buf[e*8:])
		}
		if t < f.Addr || t >= f.End {
			return jt, false
		}
		jt.Targets = append(jt.Targets, t)
	}
	return jt, true
}

// indexBound finds the compare that bounds the index register before the
// jump at j: cmp $N,%idx followed by ja (N+1 entries) or jae (N entries),
// with nothing else writing the index in between (a zero- or sign-
// extending move of the index into itself is allowed).
func (f *Function) indexBound(j int, index LiveSet) (int, bool) {
	for i := j - 1; i >= 0 && i > j-sliceWindow; i-- {
		in := &f.Insns[i]
		if in.Inst.Op == x86asm.CMP {
			r, _, _ := gpr(regArg(in.Inst.Args[0]))
			imm, isImm := in.Inst.Args[1].(x86asm.Imm)
			if r != index || !isImm || i+1 >= len(f.Insns) {
				return 0, false
			}
			switch f.Insns[i+1].Inst.Op {
			case x86asm.JA:
				return int(imm) + 1, true
			case x86asm.JAE:
				return int(imm), true
			}
			return 0, false
		}
		_, d := useDef(in, nil, nil, nil)
		if d&index != 0 && !extendsItself(in, index) {
			return 0, false
		}
	}
	return 0, false
}

func extendsItself(in *Instruction, index LiveSet) bool {
	switch in.Inst.Op {
	case x86asm.MOV, x86asm.MOVSXD, x86asm.MOVZX:
		d, _, _ := gpr(regArg(in.Inst.Args[0]))
		s, _, _ := gpr(regArg(in.Inst.Args[1]))
		return d == index && s == index
	}
	return false
}

func regArg(a x86asm.Arg) x86asm.Reg {
	r, _ := a.(x86asm.Reg)
	return r
}

// regOf is the register an indirect jump goes through: jmp *%rY, or jmp
// __x86_indirect_thunk_rY.
func regOf(in *Instruction, names NameAt) LiveSet {
	if r, ok := in.Inst.Args[0].(x86asm.Reg); ok {
		b, _, _ := gpr(r)
		return b
	}
	if t, ok := BranchTarget(in); ok && names != nil {
		if name, ok := names(t); ok && IsIndirectThunk(name) {
			if s := thunkReg(name); s != allRegs {
				return s
			}
		}
	}
	return 0
}
