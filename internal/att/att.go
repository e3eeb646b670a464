// Package att prints x86-64 instructions in AT&T syntax as objdump does.
// It wraps golang.org/x/arch's GNUSyntax and corrects the two places where
// that printer and objdump disagree on kernel code: a SIB byte with no
// index register (base %r12 or %rsp) comes out as "(%r12,%riz)", and an
// absolute displacement of zero (common for %gs-relative per-CPU data)
// comes out as an empty operand. Mnemonics (retq, callq) stay as
// x86asm prints them.
package att

import (
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// Syntax is inst at pc in objdump's AT&T syntax; symname, if not nil,
// names branch targets and absolute addresses (as for GNUSyntax).
func Syntax(inst x86asm.Inst, pc uint64, symname x86asm.SymLookup) string {
	// cfg decodes endbr64/endbr32, which x86asm does not know, as a NOP
	// carrying the opcode bytes.
	if inst.Op == x86asm.NOP && inst.Len == 4 {
		switch inst.Opcode {
		case 0xf30f1efa:
			return "endbr64"
		case 0xf30f1efb:
			return "endbr32"
		}
	}
	return fix(x86asm.GNUSyntax(inst, pc, symname))
}

// fix rewrites GNUSyntax's output where objdump prints otherwise.
func fix(s string) string {
	if strings.Contains(s, "%riz") {
		s = strings.ReplaceAll(s, ",%riz)", ")")
		for _, sc := range []string{",%riz,1)", ",%riz,2)", ",%riz,4)", ",%riz,8)"} {
			s = strings.ReplaceAll(s, sc, ")")
		}
	}
	// An empty operand: "mov ,%rax", "mov %rax,", "mov %gs:,%rax".
	op, args, ok := strings.Cut(s, " ")
	if !ok {
		return s
	}
	parts := strings.Split(args, ",")
	changed := false
	for i, p := range parts {
		switch {
		case p == "" && len(parts) > 1:
			parts[i], changed = "0x0", true
		case len(p) == 4 && p[0] == '%' && p[3] == ':':
			parts[i], changed = p+"0x0", true
		}
	}
	if !changed {
		return s
	}
	return op + " " + strings.Join(parts, ",")
}
