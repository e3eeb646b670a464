package cfg

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/att"
	"github.com/kinst/kinst/internal/x86dec"
	"github.com/kinst/kinst/kernel"
)

// Instruction is one decoded instruction of a function.
type Instruction struct {
	Addr  uint64
	Bytes []byte
	Inst  x86asm.Inst
}

// Len is the instruction's length in bytes.
func (in *Instruction) Len() int { return len(in.Bytes) }

// End is the address of the next instruction.
func (in *Instruction) End() uint64 { return in.Addr + uint64(len(in.Bytes)) }

// String is the instruction in AT&T syntax, as objdump prints it.
func (in *Instruction) String() string {
	return att.Syntax(in.Inst, in.Addr, nil)
}

// Function is a function's instructions, decoded by a linear sweep of its
// live bytes (alternatives and static keys already applied by the kernel).
type Function struct {
	Name   string
	Module string
	Addr   uint64
	End    uint64
	Insns  []Instruction
	// Truncated is set when the sweep stopped at bytes x86asm cannot
	// decode; Insns then covers [Addr, Insns[len-1].End()) only.
	Truncated bool
}

// TextReader reads kernel memory: the driver, a core dump, or a file.
type TextReader interface {
	Read(addr uint64, b []byte) error
}

// ErrFreedInit is matched by FreedInitError.
var ErrFreedInit = errors.New("init text, freed after boot")

// FreedInitError refuses a function of the kernel's init sections
// (.init.text, and .exit.text of built-in code): kallsyms still lists it,
// but the memory was freed (and maybe reused) after boot.
type FreedInitError struct{ Name string }

func (e *FreedInitError) Error() string {
	return fmt.Sprintf("%s is in the init sections, which the kernel freed after boot: nothing to analyse or splice", e.Name)
}

func (e *FreedInitError) Is(t error) bool { return t == ErrFreedInit }

// ReadFunction reads and decodes the function sym from the live kernel.
func ReadFunction(r TextReader, syms *kernel.Symbols, sym kernel.Symbol) (*Function, error) {
	return ReadFunctionInto(r, syms, sym, nil)
}

// DecodeBuf is reusable memory for a function's bytes and instructions,
// for a pass that drops each function once analysed (the whole-kernel
// census: allocating, and growing, these afresh was a third of its time).
// One goroutine uses it at a time.
type DecodeBuf struct {
	code  []byte
	insns []Instruction
}

// ReadFunctionInto is ReadFunction; with buf, the Function's bytes and
// instructions live in buf and are valid until its next use.
func ReadFunctionInto(r TextReader, syms *kernel.Symbols, sym kernel.Symbol, buf *DecodeBuf) (*Function, error) {
	if sym.Module == "" && syms.InRange(sym.Addr, "__init_begin", "__init_end") {
		return nil, &FreedInitError{Name: sym.Name}
	}
	end := syms.End(sym)
	var code []byte
	if n := int(end - sym.Addr); buf != nil {
		if cap(buf.code) < n {
			buf.code = make([]byte, n)
		}
		code = buf.code[:n]
	} else {
		code = make([]byte, n)
	}
	if err := r.Read(sym.Addr, code); err != nil {
		// The extent is a guess where no symbol follows (the end of a
		// module's text): keep what reads, a chunk at a time.
		n := 0
		for n < len(code) {
			c := min(readChunk, len(code)-n)
			if r.Read(sym.Addr+uint64(n), code[n:n+c]) != nil {
				break
			}
			n += c
		}
		if n == 0 {
			return nil, fmt.Errorf("read %s text at %#x: %w", sym.Name, sym.Addr, err)
		}
		code = code[:n]
	}
	f, err := decode(sym.Name, sym.Module, sym.Addr, code, buf)
	if err != nil || sym.Size == 0 || sym.Size >= uint64(len(code)) {
		return f, err
	}
	f.TrimToSize(sym.Addr+sym.Size, end)
	return f, nil
}

// TrimToSize ends f at size (its symbol's end), keeping the padding after
// it (nops and int3s up to the next 16-byte boundary, or the next symbol,
// next): what lies beyond is not f's. The padding is kept only if it
// fills that gap exactly, so a function that follows unaligned, or an
// endbr64 (which decodes as a nop), is never taken for padding.
func (f *Function) TrimToSize(size, next uint64) {
	n := sort.Search(len(f.Insns), func(i int) bool { return f.Insns[i].Addr >= size })
	limit := min((size+15)&^15, next)
	k := n
	for k < len(f.Insns) && f.Insns[k].End() <= limit {
		in := &f.Insns[k]
		if !(in.Inst.Op == x86asm.NOP && !isEndbr(in.Bytes) || in.Bytes[0] == 0xcc) {
			break
		}
		k++
	}
	if k == n || f.Insns[k-1].End() != limit {
		k = n // not a clean run of padding: none
	}
	if n < len(f.Insns) {
		f.Truncated = false // decoding stopped, if it did, past the function
	}
	f.Insns = f.Insns[:k]
	f.End = f.Insns[k-1].End()
}

// isEndbr: endbr64 or endbr32, which decodeInst calls a nop.
func isEndbr(b []byte) bool {
	return len(b) == 4 && b[0] == 0xf3 && b[1] == 0x0f && b[2] == 0x1e && (b[3] == 0xfa || b[3] == 0xfb)
}

// decodeInst decodes one instruction. x86asm (v0.32) does not know
// endbr64/endbr32, which start every function of an IBT kernel (Debian's
// 6.12): they decode here as a 4-byte NOP, which is what they do when
// executed (no register, flag or memory effect). Splicing them is refused
// elsewhere (Function.HasLandingPad, codegen).
// Everything else is internal/x86dec's (x86asm with its vzeroupper
// length corrected: glibc's AVX2 and EVEX string functions end their
// loops with one, and every boundary after it came out wrong).
func decodeInst(b []byte) (x86asm.Inst, error) {
	if len(b) >= 4 && isEndbr(b[:4]) {
		return x86asm.Inst{Op: x86asm.NOP, Len: 4, Mode: 64, Opcode: uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])}, nil
	}
	return x86dec.Decode(b)
}

// Header is f without its instructions: its name, module and bounds.
func (f *Function) Header() *Function {
	return &Function{Name: f.Name, Module: f.Module, Addr: f.Addr, End: f.End, Truncated: f.Truncated}
}

// DecodeAt decodes the one instruction in b, which starts at addr: a
// site kept as bytes only (splice.Site.Detached) decodes it again when
// asked for it.
func DecodeAt(addr uint64, b []byte) (Instruction, error) {
	inst, err := decodeInst(b)
	if err != nil {
		return Instruction{}, err
	}
	return Instruction{Addr: addr, Bytes: b[:inst.Len:inst.Len], Inst: inst}, nil
}

// readChunk is the granule of the fallback read in ReadFunction.
const readChunk = 8

// Decode splits code, the bytes of a function at addr, into instructions.
func Decode(name, module string, addr uint64, code []byte) (*Function, error) {
	return decode(name, module, addr, code, nil)
}

// avgInsnLen sizes a function's instruction slice up front: kernel code
// averages about 4 bytes an instruction.
const avgInsnLen = 4

// maxScratch bounds the functions decoded through scratchInsns: a buffer
// for one instruction a byte of 16 KiB is 3 MB.
const maxScratch = 16 << 10

// scratchInsns are decode's buffers when the caller gives none, for
// functions of up to maxScratch bytes.
var scratchInsns = sync.Pool{New: func() any { return new([]Instruction) }}

func decode(name, module string, addr uint64, code []byte, buf *DecodeBuf) (f *Function, err error) {
	f = &Function{Name: name, Module: module, Addr: addr, End: addr + uint64(len(code))}
	if buf != nil {
		// Room for the worst case, one instruction a byte, so the
		// loop below never grows the slice.
		if cap(buf.insns) < len(code) {
			buf.insns = make([]Instruction, 0, max(len(code), 2*cap(buf.insns)))
		}
		f.Insns = buf.insns[:0]
	} else if len(code) > maxScratch {
		f.Insns = make([]Instruction, 0, len(code)/avgInsnLen+4)
	} else {
		// Decoded into scratch, then copied out at its exact length:
		// sized up front from the bytes, a function with int3 padding
		// (1-byte instructions) grew its slice, and one without
		// wasted room; either way a whole-kernel plan allocated
		// gigabytes (an Instruction is about 200 bytes).
		sc := scratchInsns.Get().(*[]Instruction)
		defer func() {
			if f != nil {
				n := len(f.Insns)
				f.Insns = slices.Clone(f.Insns)
				clear((*sc)[:n]) // let go of the code and operands
			}
			scratchInsns.Put(sc)
		}()
		if cap(*sc) < len(code) {
			*sc = make([]Instruction, 0, len(code))
		}
		f.Insns = (*sc)[:0]
	}
	for off := 0; off < len(code); {
		inst, err := decodeInst(code[off:])
		if err != nil || inst.Op == 0 {
			f.Truncated = true
			break
		}
		f.Insns = append(f.Insns, Instruction{
			Addr:  addr + uint64(off),
			Bytes: code[off : off+inst.Len : off+inst.Len],
			Inst:  inst,
		})
		off += inst.Len
	}
	if len(f.Insns) == 0 {
		f = nil
		return nil, fmt.Errorf("%s at %#x: no decodable instruction", name, addr)
	}
	return f, nil
}

// ErrNotBoundary is matched by every NotBoundaryError.
var ErrNotBoundary = errors.New("not an instruction boundary")

// NotBoundaryError reports an address inside an instruction.
type NotBoundaryError struct {
	Addr      uint64
	Insn      uint64 // start of the instruction that contains Addr
	InsnLen   int
	InsnText  string
	Function  string
	InsnOff   uint64
	Requested uint64 // offset requested into Function
}

func (e *NotBoundaryError) Error() string {
	return fmt.Sprintf("%s+%#x is inside the %d-byte instruction at %s+%#x (%s): not an instruction boundary",
		e.Function, e.Requested, e.InsnLen, e.Function, e.InsnOff, e.InsnText)
}

func (e *NotBoundaryError) Is(target error) bool { return target == ErrNotBoundary }

// Index returns the index of the instruction starting at addr.
func (f *Function) Index(addr uint64) (int, error) {
	if addr < f.Addr || addr >= f.End {
		return 0, fmt.Errorf("%#x is outside %s [%#x, %#x)", addr, f.Name, f.Addr, f.End)
	}
	i := sort.Search(len(f.Insns), func(i int) bool { return f.Insns[i].End() > addr })
	if i == len(f.Insns) {
		return 0, fmt.Errorf("%s+%#x lies past the last decodable instruction", f.Name, addr-f.Addr)
	}
	in := &f.Insns[i]
	if in.Addr != addr {
		return 0, &NotBoundaryError{Addr: addr, Insn: in.Addr, InsnLen: in.Len(), InsnText: in.String(),
			Function: f.Name, InsnOff: in.Addr - f.Addr, Requested: addr - f.Addr}
	}
	return i, nil
}

// nop5 is the 5-byte nop the kernel leaves at an ftrace site while no
// tracer uses it.
var nop5 = []byte{0x0f, 0x1f, 0x44, 0x00, 0x00}

// endbr64 starts functions on kernels built with IBT (6.12's Debian
// kernels; 6.1's are built without).
var endbr64 = []byte{0xf3, 0x0f, 0x1e, 0xfa}

// endbrPoison is what an IBT kernel writes over the endbr64 of a function
// nothing calls indirectly ("sealing", apply_seal_endbr): osp nop3, a
// 4-byte nop unique to former endbr sites (gen_endbr_poison, 6.2 on).
var endbrPoison = []byte{0x66, 0x0f, 0x1f, 0x00}

// HasLandingPad reports whether the function starts with an endbr64 or
// its sealed form. The kernel owns those 4 bytes: indirect calls must land
// on an endbr64 when IBT is on, FineIBT rewrites them at boot, and sealing
// may rewrite them then too.
func (f *Function) HasLandingPad() bool {
	return len(f.Insns) > 0 && (bytes.Equal(f.Insns[0].Bytes, endbr64) || bytes.Equal(f.Insns[0].Bytes, endbrPoison))
}

// IsFtraceSite reports whether instruction i is the function's ftrace
// site: the first instruction (after an endbr64 or its sealed form), 5 bytes long, either
// the idle nop or a call that ftrace patched in. ftrace owns those bytes
// and rewrites them at any time.
func (f *Function) IsFtraceSite(i int) bool {
	first := 0
	if f.HasLandingPad() {
		first = 1
	}
	if i != first || i >= len(f.Insns) {
		return false
	}
	in := &f.Insns[i]
	return in.Len() == 5 && (bytes.Equal(in.Bytes, nop5) || in.Inst.Op == x86asm.CALL)
}

// IsControlTransfer reports whether the instruction may not fall through
// to the next one: every branch, return, call and trap.
func IsControlTransfer(in *Instruction) bool {
	switch in.Inst.Op {
	case x86asm.JMP, x86asm.LJMP, x86asm.RET, x86asm.LRET, x86asm.CALL, x86asm.LCALL,
		x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JNE,
		x86asm.JG, x86asm.JGE, x86asm.JL, x86asm.JLE, x86asm.JO, x86asm.JNO,
		x86asm.JP, x86asm.JNP, x86asm.JS, x86asm.JNS,
		x86asm.JCXZ, x86asm.JECXZ, x86asm.JRCXZ, x86asm.LOOP, x86asm.LOOPE, x86asm.LOOPNE,
		x86asm.INT, x86asm.UD0, x86asm.UD1, x86asm.UD2, x86asm.HLT, x86asm.IRET, x86asm.IRETD, x86asm.IRETQ,
		x86asm.SYSCALL, x86asm.SYSRET, x86asm.SYSENTER, x86asm.SYSEXIT:
		return true
	}
	return false
}

// BranchTarget returns the target of a direct (relative) branch or call.
func BranchTarget(in *Instruction) (uint64, bool) {
	if len(in.Inst.Args) == 0 {
		return 0, false
	}
	rel, ok := in.Inst.Args[0].(x86asm.Rel)
	if !ok {
		return 0, false
	}
	return in.End() + uint64(int64(rel)), true
}

// BranchTargets returns the set of addresses inside the function that a
// direct jump of the function lands on.
func (f *Function) BranchTargets() map[uint64]bool {
	t := make(map[uint64]bool)
	for i := range f.Insns {
		in := &f.Insns[i]
		if in.Inst.Op == x86asm.CALL {
			continue
		}
		if a, ok := BranchTarget(in); ok && a >= f.Addr && a < f.End {
			t[a] = true
		}
	}
	return t
}

// EntryBlock returns the indices [0, n) of the function's entry block: the
// instructions up to and including the first control transfer other than
// a call (callees return), cut short where a jump of the function lands (a
// loop back to the top makes such an instruction run more than once per
// call).
func (f *Function) EntryBlock() int {
	targets := f.BranchTargets()
	for i := range f.Insns {
		if i > 0 && targets[f.Insns[i].Addr] {
			return i
		}
		if in := &f.Insns[i]; IsControlTransfer(in) && in.Inst.Op != x86asm.CALL {
			return i + 1
		}
	}
	return len(f.Insns)
}
