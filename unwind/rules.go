package unwind

import "fmt"

// Reg is a DWARF register number of the x86-64 psABI.
type Reg uint8

// The registers the unwinder reads.
const (
	RegRSP Reg = 7
	RegRBP Reg = 6
	RegRIP Reg = 16 // the return-address column
)

// regNames are readelf's names of the x86-64 DWARF registers.
var regNames = func() []string {
	n := []string{"rax", "rdx", "rcx", "rbx", "rsi", "rdi", "rbp", "rsp",
		"r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip"}
	for i := 0; i < 16; i++ {
		n = append(n, fmt.Sprintf("xmm%d", i))
	}
	for i := 0; i < 8; i++ {
		n = append(n, fmt.Sprintf("st%d", i))
	}
	for i := 0; i < 8; i++ {
		n = append(n, fmt.Sprintf("mm%d", i))
	}
	n = append(n, "rflags", "es", "cs", "ss", "ds", "fs", "gs", "", "", "fs.base", "gs.base", "", "", "tr", "ldtr")
	return n
}()

// String is readelf's name of the register, or rN.
func (r Reg) String() string {
	if int(r) < len(regNames) && regNames[r] != "" {
		return regNames[r]
	}
	return fmt.Sprintf("r%d", uint8(r))
}

// CFAKind says how the canonical frame address is computed.
type CFAKind uint8

const (
	// CFANone: no FDE covers the pc.
	CFANone CFAKind = iota
	// CFARegOffset: CFA = Reg + Offset.
	CFARegOffset
	// CFAPLT: the standard .plt expression, CFA = rsp + Offset +
	// 8·((rip & 15) >= Threshold): in a 16-byte lazy PLT entry the push
	// of the relocation index moves rsp once rip passes the threshold.
	CFAPLT
	// CFAExpression: any other DWARF expression (unsupported).
	CFAExpression
)

// CFA is the rule for the canonical frame address: the value of rsp in
// the caller just before the call instruction.
type CFA struct {
	Kind      CFAKind
	Reg       Reg   // CFARegOffset
	Offset    int64 // CFARegOffset, CFAPLT
	Threshold uint8 // CFAPLT
}

// String is the rule in readelf's frames-interp notation: "rsp+8",
// "exp", and "u" when no FDE covers the pc.
func (c CFA) String() string {
	switch c.Kind {
	case CFARegOffset:
		return fmt.Sprintf("%s%+d", c.Reg, c.Offset)
	case CFAPLT, CFAExpression:
		return "exp"
	}
	return "u"
}

// RuleKind says how a register of the caller is recovered.
type RuleKind uint8

const (
	// RuleUndefined: not saved by this frame. For rbp (callee-saved) the
	// value is unchanged; for the return address it ends the stack.
	RuleUndefined RuleKind = iota
	RuleSameValue
	RuleOffset        // saved at CFA + Offset
	RuleValOffset     // the value is CFA + Offset
	RuleRegister      // the value is in register Reg
	RuleExpression    // saved at an address computed by an expression (unsupported)
	RuleValExpression // the value is computed by an expression (unsupported)
)

// Rule recovers one register of the caller.
type Rule struct {
	Kind   RuleKind
	Offset int64 // RuleOffset, RuleValOffset
	Reg    Reg   // RuleRegister
}

// String is the rule in readelf's frames-interp notation: u, s, c-16,
// v+8, "r3 (rbx)", exp, vexp.
func (r Rule) String() string {
	switch r.Kind {
	case RuleSameValue:
		return "s"
	case RuleOffset:
		return fmt.Sprintf("c%+d", r.Offset)
	case RuleValOffset:
		return fmt.Sprintf("v%+d", r.Offset)
	case RuleRegister:
		return fmt.Sprintf("r%d (%s)", uint8(r.Reg), r.Reg)
	case RuleExpression:
		return "exp"
	case RuleValExpression:
		return "vexp"
	}
	return "u"
}

// Row is the unwind rules from PC up to the next row's PC.
type Row struct {
	PC  uint64
	CFA CFA
	RBP Rule
	RA  Rule
}

// rules is the state the CFA program of an FDE evolves: the CFA, rbp
// and return-address rules (other registers are not needed to unwind).
type rules struct {
	cfa CFA
	rbp Rule
	ra  Rule
}
