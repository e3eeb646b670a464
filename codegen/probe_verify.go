package codegen

import (
	"golang.org/x/arch/x86/x86asm"
)

// probeOps are the only operations a probe's code may contain.
var probeOps = map[x86asm.Op]bool{
	x86asm.PUSHFQ: true, x86asm.POPFQ: true, x86asm.PUSH: true, x86asm.POP: true,
	x86asm.RDTSC: true, x86asm.SHL: true, x86asm.OR: true, x86asm.NEG: true,
	x86asm.INC: true, x86asm.LEA: true, x86asm.MOV: true, x86asm.TEST: true,
	x86asm.JE: true, x86asm.JNE: true, x86asm.ADD: true, x86asm.CMPXCHG: true,
	x86asm.CMP: true,
}

// VerifyProbe decodes the first n bytes of a patch built by ProbePatch at
// base and checks them without trusting the generator: only the expected
// operations; every memory write is locked and goes to one of the probe's
// words; every RIP-relative operand names one of those words; %gs is read
// only at the guard's current-task offset and the task only inside the
// guarded field; branches stay inside the probe; pushes and pops pair up
// (so every register is restored) and RFLAGS is saved when it must be.
// The rest of the patch (the relocated instruction) is checked with
// VerifyRelocation.
func VerifyProbe(code []byte, base uint64, n int, p *Probe) error {
	if n > len(code) {
		return &VerifyError{Offset: len(code), Reason: "probe longer than the patch"}
	}
	words := map[uint64]bool{}
	for _, a := range p.Actions {
		words[a.Word] = true
	}
	r := &reader{code: code[:n], base: base}
	var stack []x86asm.Reg
	flagsSaved := false
	for r.off < n {
		inst, _, err := r.decode(15)
		if err != nil {
			return err
		}
		pc := r.pc()
		if !probeOps[inst.Op] {
			return r.fail("unexpected %s in a probe", gnu(inst, pc))
		}
		switch inst.Op {
		case x86asm.PUSHFQ:
			if r.off != 0 {
				return r.fail("pushfq not first")
			}
			flagsSaved = true
		case x86asm.POPFQ:
			if !flagsSaved || r.off+inst.Len != n || len(stack) != 0 {
				return r.fail("popfq not last, or without pushfq")
			}
		case x86asm.PUSH:
			reg, ok := inst.Args[0].(x86asm.Reg)
			if !ok {
				return r.fail("push of a non-register")
			}
			stack = append(stack, reg)
		case x86asm.POP:
			reg, ok := inst.Args[0].(x86asm.Reg)
			if !ok || len(stack) == 0 || stack[len(stack)-1] != reg {
				return r.fail("%s does not restore the last register pushed", gnu(inst, pc))
			}
			stack = stack[:len(stack)-1]
		case x86asm.JE, x86asm.JNE:
			rel, ok := inst.Args[0].(x86asm.Rel)
			t := pc + uint64(inst.Len) + uint64(int64(rel))
			if !ok || t < base || t > base+uint64(n) {
				return r.fail("branch to %#x leaves the probe", t)
			}
		}
		if inst.Op != x86asm.LEA {
			for i, a := range inst.Args {
				m, ok := a.(x86asm.Mem)
				if !ok {
					continue
				}
				if err := r.checkProbeMem(inst, i, m, pc, words, p.Guard); err != nil {
					return err
				}
			}
		}
		r.off += inst.Len
	}
	if len(stack) != 0 {
		return r.fail("%d registers pushed and never popped", len(stack))
	}
	if p.SaveFlags && !flagsSaved {
		return r.fail("flags are live at the site but not saved")
	}
	return nil
}

// checkProbeMem checks memory operand i of inst.
func (r *reader) checkProbeMem(inst x86asm.Inst, i int, m x86asm.Mem, pc uint64, words map[uint64]bool, g *Guard) error {
	write := i == 0 && inst.Op != x86asm.CMP && inst.Op != x86asm.TEST
	switch {
	case m.Base == x86asm.RIP:
		t := pc + uint64(inst.Len) + uint64(m.Disp)
		if !words[t] {
			return r.fail("%s addresses %#x, not one of the probe's words", gnu(inst, pc), t)
		}
		if write && !hasLock(inst) {
			return r.fail("%s writes a shared word without lock", gnu(inst, pc))
		}
	case m.Segment == x86asm.GS && m.Base == 0 && m.Index == 0:
		if g == nil || uint64(m.Disp) != uint64(g.CurrentTask) || write {
			return r.fail("%s: unexpected per-CPU access", gnu(inst, pc))
		}
	case m.Base == x86asm.RAX && m.Index == 0 && m.Segment == 0:
		if g == nil || write || m.Disp < int64(g.Offset) || m.Disp >= int64(g.Offset)+TaskCommLen {
			return r.fail("%s: task access outside the guarded field", gnu(inst, pc))
		}
	default:
		return r.fail("%s: unexpected memory operand", gnu(inst, pc))
	}
	return nil
}

func hasLock(inst x86asm.Inst) bool {
	for _, p := range inst.Prefix {
		if p == 0 {
			break
		}
		if p&0xff == x86asm.PrefixLOCK {
			return true
		}
	}
	return false
}
