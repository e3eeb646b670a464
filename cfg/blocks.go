package cfg

import (
	"sort"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// EdgeKind says how control passes from one block to another.
type EdgeKind int

const (
	// Fallthrough: into the next block (including a jcc not taken).
	Fallthrough EdgeKind = iota
	// Jump: an unconditional direct jmp.
	Jump
	// Taken: a conditional branch taken.
	Taken
	// Table: one entry of a resolved jump table.
	Table
)

func (k EdgeKind) String() string {
	return [...]string{"fallthrough", "jump", "taken", "table"}[k]
}

// Edge is a control transfer between blocks of one function.
type Edge struct {
	Kind EdgeKind
	To   int // index of the target block
}

// ExitKind says how a block leaves the function, if it does.
type ExitKind int

const (
	NoExit ExitKind = iota
	// Return: ret, or jmp to a return thunk (__x86_return_thunk and kin).
	Return
	// TailCall: a direct jmp to another function.
	TailCall
	// IndirectJump: a jump through a register or memory, or through a
	// retpoline thunk, that this analysis does not resolve (jump tables
	// come later; a retpoline kernel is built with -fno-jump-tables).
	IndirectJump
	// NoReturnCall: a call to a function that never returns (found by
	// AnalyzeKernel, not from a list).
	NoReturnCall
	// Trap: int3 — control does not continue; in user code
	// (BlockOptions.User) hlt and ud2 too. (In the kernel ud2 is not one:
	// WARN() resumes after its ud2; BUG() does not, but telling them
	// apart needs __bug_table.)
	Trap
)

func (k ExitKind) String() string {
	return [...]string{"", "return", "tail-call", "indirect-jump", "noreturn-call", "trap"}[k]
}

// Block is a basic block: a run of instructions entered only at the top
// and left only at the bottom. Calls do not end blocks.
type Block struct {
	Index int
	First int // index of the first instruction
	N     int // number of instructions
	Succs []Edge
	Preds []int
	Exit  ExitKind
	// Padding blocks are unreachable nops and int3s between functions:
	// never executed, candidate springboard space.
	Padding bool
	// JumpTable is set when the block ends in an indirect jump through a
	// resolved table; its targets are the block's successors.
	JumpTable *JumpTable
}

// Start is the block's first address.
func (b *Block) Start(f *Function) uint64 { return f.Insns[b.First].Addr }

// Last is the block's last instruction.
func (b *Block) Last(f *Function) *Instruction { return &f.Insns[b.First+b.N-1] }

// NameAt names kernel addresses for the analysis: return thunks and tail
// calls are told apart by the name of the jump's target. Nil is allowed.
type NameAt func(addr uint64) (string, bool)

// IsReturnThunk reports the kernel's return thunks: with RETHUNK, function
// returns are jmp __x86_return_thunk (or a mitigation's variant).
func IsReturnThunk(name string) bool {
	return name == "__x86_return_thunk" || strings.HasSuffix(name, "_return_thunk") || name == "retbleed_return_thunk"
}

// IsIndirectThunk reports retpoline thunks: call __x86_indirect_thunk_rax
// is an indirect call through %rax.
func IsIndirectThunk(name string) bool {
	return strings.HasPrefix(name, "__x86_indirect_thunk_") || strings.HasPrefix(name, "__x86_indirect_call_thunk_")
}

// NoReturn reports whether the function at a call's target never returns.
type NoReturn func(target uint64) bool

// NoReturnSet holds the start addresses of functions that never return.
type NoReturnSet map[uint64]bool

// Func adapts the set for BlockOptions; nil for a nil set.
func (s NoReturnSet) Func() NoReturn {
	if s == nil {
		return nil
	}
	return func(a uint64) bool { return s[a] }
}

// BlockOptions tune how a function is split into blocks. All are optional.
type BlockOptions struct {
	Names    NameAt     // names call and jump targets (return thunks, retpolines)
	NoReturn NoReturn   // calls to these end their block
	Tables   TextReader // reads jump tables, so indirect jumps through them resolve
	// User says the code runs in user mode, where hlt, ud0, ud1 and ud2
	// fault (a signal, not the next instruction): their blocks end as a
	// Trap, with no fall-through. In the kernel hlt resumes after an
	// interrupt and WARN()'s ud2 after its report, so they fall through.
	User bool
}

// Blocks splits f into basic blocks. Leaders are the entry, every direct
// branch target inside f, and every instruction after a block-ending one.
func (f *Function) Blocks(names NameAt) []Block { return f.BlocksOpt(BlockOptions{Names: names}) }

// BlocksWith is Blocks where calls to functions noReturn names end their
// block with no successor. noReturn may be nil.
func (f *Function) BlocksWith(names NameAt, noReturn NoReturn) []Block {
	return f.BlocksOpt(BlockOptions{Names: names, NoReturn: noReturn})
}

// BlocksOpt splits f into basic blocks with the given options.
func (f *Function) BlocksOpt(o BlockOptions) []Block {
	names, noReturn := o.Names, o.NoReturn
	// Slices and sorted searches rather than maps: this runs for every
	// function of the kernel.
	leader := make([]bool, len(f.Insns))
	leader[0] = true
	targets := f.BranchTargets()
	var tables map[int]JumpTable
	for i := range f.Insns {
		in := &f.Insns[i]
		if in.Inst.Op == x86asm.JMP && o.Tables != nil {
			if _, direct := BranchTarget(in); !direct || regOf(in, names) != 0 {
				if jt, ok := f.jumpTable(i, o.Tables, names); ok {
					if tables == nil {
						tables = map[int]JumpTable{}
					}
					tables[i] = jt
					for _, t := range jt.Targets {
						targets[t] = true
					}
				}
			}
		}
	}
	for i := range f.Insns {
		in := &f.Insns[i]
		if targets[in.Addr] {
			leader[i] = true
		}
		if (endsBlock(in) || isNoReturnCall(in, noReturn)) && i+1 < len(f.Insns) {
			leader[i+1] = true
		}
	}
	var starts []int
	for i, l := range leader {
		if l {
			starts = append(starts, i)
		}
	}
	blocks := make([]Block, len(starts))
	for bi, s := range starts {
		end := len(f.Insns)
		if bi+1 < len(starts) {
			end = starts[bi+1]
		}
		blocks[bi] = Block{Index: bi, First: s, N: end - s}
	}
	// byAddr maps a leader's address to its block; false for an address
	// that starts no decoded instruction (a jump into the middle of one,
	// or past where decoding stopped).
	byAddr := func(a uint64) (int, bool) {
		i := sort.Search(len(starts), func(i int) bool { return f.Insns[starts[i]].Addr >= a })
		return i, i < len(starts) && f.Insns[starts[i]].Addr == a
	}
	// Edges of every block share one backing array (a block has at most
	// two besides a jump table's): an allocation per block was a large
	// part of the census's.
	edges := make([]Edge, 0, 2*len(blocks))
	for bi := range blocks {
		b := &blocks[bi]
		first := len(edges)
		f.succs(b, bi, len(blocks), tables, byAddr, names, noReturn, o.User, &edges)
		b.Succs = edges[first:len(edges):len(edges)]
	}
	fillPreds(blocks)
	markPadding(f, blocks)
	return blocks
}

// fillPreds sets every block's predecessors from the successors, in one
// backing array.
func fillPreds(blocks []Block) {
	npred := make([]int, len(blocks))
	total := 0
	for bi := range blocks {
		for _, e := range blocks[bi].Succs {
			npred[e.To]++
			total++
		}
	}
	preds := make([]int, total)
	for bi := range blocks {
		n := npred[bi]
		blocks[bi].Preds, preds = preds[:0:n], preds[n:]
	}
	for bi := range blocks {
		for _, e := range blocks[bi].Succs {
			blocks[e.To].Preds = append(blocks[e.To].Preds, bi)
		}
	}
}

// succs appends block bi's successor edges to edges and sets its exit
// kind and jump table.
func (f *Function) succs(b *Block, bi, nblocks int, tables map[int]JumpTable, byAddr func(uint64) (int, bool),
	names NameAt, noReturn NoReturn, user bool, edges *[]Edge) {
	{
		last := b.Last(f)
		target, direct := BranchTarget(last)
		inside := direct && target >= f.Addr && target < f.End
		name := ""
		if direct && !inside && names != nil {
			name, _ = names(target)
		}
		if jt, ok := tables[b.First+b.N-1]; ok {
			seen := map[int]bool{}
			for _, t := range jt.Targets {
				if to, _ := byAddr(t); !seen[to] { // table targets were made leaders
					seen[to] = true
					*edges = append(*edges, Edge{Table, to})
				}
			}
			jt := jt // only a resolved table is copied to the heap
			b.JumpTable = &jt
			return
		}
		switch op := last.Inst.Op; {
		case isNoReturnCall(last, noReturn):
			b.Exit = NoReturnCall
		case op == x86asm.RET:
			b.Exit = Return
		case op == x86asm.JMP && inside:
			if to, ok := byAddr(target); ok {
				*edges = append(*edges, Edge{Jump, to})
			} else {
				b.Exit = IndirectJump // lands where we did not decode: assume anything
			}
		case op == x86asm.JMP && direct && IsReturnThunk(name):
			b.Exit = Return
		case op == x86asm.JMP && direct && IsIndirectThunk(name):
			b.Exit = IndirectJump // jmp __x86_indirect_thunk_rax: a retpolined jmp *%rax
		case op == x86asm.JMP && direct:
			b.Exit = TailCall
		case op == x86asm.JMP:
			b.Exit = IndirectJump
		case last.Bytes[0] == 0xcc, user && userFault(op):
			b.Exit = Trap
		case IsControlTransfer(last) && op != x86asm.CALL:
			// Conditional branch: taken, then not taken.
			if to, ok := byAddr(target); inside && ok {
				*edges = append(*edges, Edge{Taken, to})
			} else if inside {
				b.Exit = IndirectJump // lands where we did not decode: assume anything
			}
			fallthrough
		default:
			if bi+1 < nblocks {
				*edges = append(*edges, Edge{Fallthrough, bi + 1})
			}
		}
	}
}

// userFault: an instruction that faults in user mode, always (hlt is
// privileged; the ud's are undefined on purpose).
func userFault(op x86asm.Op) bool {
	return op == x86asm.HLT || op == x86asm.UD0 || op == x86asm.UD1 || op == x86asm.UD2
}

func isNoReturnCall(in *Instruction, noReturn NoReturn) bool {
	if noReturn == nil || in.Inst.Op != x86asm.CALL {
		return false
	}
	t, ok := BranchTarget(in)
	return ok && noReturn(t)
}

// endsBlock: every control transfer but a call.
func endsBlock(in *Instruction) bool {
	return IsControlTransfer(in) && in.Inst.Op != x86asm.CALL || in.Bytes[0] == 0xcc
}

// markPadding flags blocks unreachable from the entry that hold only nops
// and int3s.
func markPadding(f *Function, blocks []Block) {
	seen := make([]bool, len(blocks))
	work := []int{0}
	seen[0] = true
	for len(work) > 0 {
		b := work[len(work)-1]
		work = work[:len(work)-1]
		for _, e := range blocks[b].Succs {
			if !seen[e.To] {
				seen[e.To] = true
				work = append(work, e.To)
			}
		}
	}
	for bi := range blocks {
		if seen[bi] {
			continue
		}
		pad := true
		for i := blocks[bi].First; i < blocks[bi].First+blocks[bi].N; i++ {
			in := &f.Insns[i]
			if in.Inst.Op != x86asm.NOP && in.Bytes[0] != 0xcc {
				pad = false
				break
			}
		}
		blocks[bi].Padding = pad
	}
}
