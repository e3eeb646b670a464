package codegen

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

const (
	siteAddr = 0xffffffff81234560 // kernel text
	counter  = 0xffffffffc0b00008 // counter heap, module area
)

// Patch addresses a few hundred MiB above and below the site: the module
// area (above), and the other direction to catch sign mistakes.
var patchAddrs = []uint64{
	0xffffffffc0a00000, // +0.98 GiB
	0xffffffff6a000000, // -370 MiB
}

// i32 encodes a little-endian 32-bit field.
func i32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// decoded is one instruction of generated code.
type decoded struct {
	pc   uint64
	inst x86asm.Inst
	enc  []byte
}

// target is where a relative branch lands.
func (d decoded) target() (uint64, bool) {
	rel, ok := d.inst.Args[0].(x86asm.Rel)
	return d.pc + uint64(d.inst.Len) + uint64(int64(rel)), ok
}

func decodeAll(code []byte, addr uint64) ([]decoded, error) {
	var out []decoded
	for off := 0; off < len(code); {
		inst, err := x86dec.Decode(code[off:])
		if err == nil && inst.Op == 0 {
			err = fmt.Errorf("invalid")
		}
		if err != nil {
			return nil, fmt.Errorf("+%d: % x: %v", off, code[off:], err)
		}
		out = append(out, decoded{addr + uint64(off), inst, code[off : off+inst.Len]})
		off += inst.Len
	}
	return out, nil
}

// checkSemantics is the tests' own statement of the relocation rules,
// written from the decoded original and output only (no package
// internals): code placed at addr must do what site does.
func checkSemantics(site Site, addr uint64, code []byte) error {
	orig, err := x86dec.Decode(site.Bytes)
	if err != nil {
		return err
	}
	out, err := decodeAll(code, addr)
	if err != nil {
		return err
	}
	next := site.Addr + uint64(len(site.Bytes))
	rel, isRel := orig.Args[0].(x86asm.Rel)
	target := next + uint64(int64(rel))
	want := func(n int) error {
		if len(out) != n {
			return fmt.Errorf("%d instructions, want %d: %s", len(out), n, listing(out))
		}
		return nil
	}
	jumpsTo := func(i int, op x86asm.Op, to uint64) error {
		got, ok := out[i].target()
		if out[i].inst.Op != op || !ok || got != to {
			return fmt.Errorf("instruction %d: %s, want %v to %#x", i, gnu(out[i].inst, out[i].pc), op, to)
		}
		return nil
	}
	pushes := func(i int) error {
		imm, ok := out[i].inst.Args[0].(x86asm.Imm)
		if out[i].inst.Op != x86asm.PUSH || !ok || uint64(int64(imm)) != next || out[i].inst.DataSize == 16 {
			return fmt.Errorf("instruction %d: %s, want push $%#x", i, gnu(out[i].inst, out[i].pc), next)
		}
		return nil
	}
	switch op := orig.Op; {
	case isRel && isJcc(op):
		return firstErr(want(2), func() error { return jumpsTo(0, op, target) }, func() error { return jumpsTo(1, x86asm.JMP, next) })
	case isRel && op == x86asm.JMP:
		return firstErr(want(1), func() error { return jumpsTo(0, x86asm.JMP, target) })
	case isRel && op == x86asm.CALL:
		return firstErr(want(2), func() error { return pushes(0) }, func() error { return jumpsTo(1, x86asm.JMP, target) })
	case isRel: // loop*, jrcxz: taken → the jmp to the target; not → the jmp back
		return firstErr(want(4),
			func() error { return jumpsTo(0, op, out[2].pc) },
			func() error { return jumpsTo(1, x86asm.JMP, out[3].pc) },
			func() error { return jumpsTo(2, x86asm.JMP, target) },
			func() error { return jumpsTo(3, x86asm.JMP, next) })
	case op == x86asm.CALL:
		return firstErr(want(2), func() error { return pushes(0) },
			func() error { return sameAs(out[1], x86asm.JMP, site, orig) })
	case op == x86asm.JMP || op == x86asm.RET:
		return firstErr(want(1), func() error { return sameAs(out[0], op, site, orig) })
	}
	return firstErr(want(2), func() error { return sameAs(out[0], orig.Op, site, orig) },
		func() error { return jumpsTo(1, x86asm.JMP, next) })
}

// sameAs checks that d is operation op with the original's prefixes and
// operands; a memory operand may differ only as RIP-relative ones do: by a
// displacement that keeps the absolute address.
func sameAs(d decoded, op x86asm.Op, site Site, orig x86asm.Inst) error {
	if d.inst.Op != op || d.inst.Len != orig.Len || d.inst.Prefix != orig.Prefix {
		return fmt.Errorf("%s, want %v like %s", gnu(d.inst, d.pc), op, gnu(orig, site.Addr))
	}
	shift := int64(site.Addr - d.pc) // a RIP-relative disp grows by this
	for i, a := range d.inst.Args {
		b := orig.Args[i]
		ma, okA := a.(x86asm.Mem)
		mb, okB := b.(x86asm.Mem)
		if !okA || !okB {
			if a != b {
				return fmt.Errorf("operand %d: %v, want %v", i, a, b)
			}
			continue
		}
		if ma.Base == x86asm.RIP {
			ma.Disp, mb.Disp = int64(int32(ma.Disp)), int64(int32(mb.Disp))
		}
		if ma.Disp != mb.Disp && (ma.Base == x86asm.RIP || ma.Base == 0 && ma.Index == 0) {
			if ma.Disp-mb.Disp != shift {
				return fmt.Errorf("operand %d: disp %#x, want %#x (same absolute address)", i, ma.Disp, mb.Disp+shift)
			}
			ma.Disp = mb.Disp
		}
		if ma != mb {
			return fmt.Errorf("operand %d: %v, want %v", i, a, b)
		}
		if ma.Base == x86asm.RIP && shift != 0 && bytes.Equal(d.enc, site.Bytes) {
			return fmt.Errorf("RIP-relative operand copied unchanged")
		}
	}
	// Byte for byte the same, but for one 4-byte displacement (and the
	// ModRM reg field of a call turned into a jmp: /2 → /4).
	want := bytes.Clone(site.Bytes)
	diff := -1
	for i := range d.enc {
		if d.enc[i] == want[i] {
			continue
		}
		if op == x86asm.JMP && orig.Op == x86asm.CALL && diff < 0 && want[i]>>3&7 == 2 && d.enc[i] == want[i]^0x30 {
			want[i] = d.enc[i]
			continue
		}
		if diff < 0 {
			diff = i
		}
		if i >= diff+4 {
			return fmt.Errorf("encoding % x differs from % x beyond a displacement", d.enc, site.Bytes)
		}
	}
	if op == x86asm.JMP && orig.Op == x86asm.CALL && bytes.Equal(want, site.Bytes) {
		return fmt.Errorf("encoding % x is still a call", d.enc)
	}
	return nil
}

func isJcc(op x86asm.Op) bool {
	switch op {
	case x86asm.JA, x86asm.JAE, x86asm.JB, x86asm.JBE, x86asm.JE, x86asm.JNE, x86asm.JG, x86asm.JGE,
		x86asm.JL, x86asm.JLE, x86asm.JO, x86asm.JNO, x86asm.JP, x86asm.JNP, x86asm.JS, x86asm.JNS:
		return true
	}
	return false
}

func firstErr(first error, rest ...func() error) error {
	if first != nil {
		return first
	}
	for _, f := range rest {
		if err := f(); err != nil {
			return err
		}
	}
	return nil
}

func listing(out []decoded) string {
	var b bytes.Buffer
	for _, d := range out {
		fmt.Fprintf(&b, "\n\t%#x: % -20x %s", d.pc, d.enc, gnu(d.inst, d.pc))
	}
	return b.String()
}
