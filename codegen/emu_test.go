package codegen

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/internal/x86dec"
)

// A small interpreter for the instructions probes use, on x86asm's decoding
// (not on our encoder's tables), so tests can run generated probes and
// compare what they do with what they should do, including several CPUs
// interleaved one instruction at a time: each instruction is atomic here,
// which is what the lock prefix guarantees on hardware.

type machine struct {
	mem    map[uint64]byte
	gsBase uint64
	tsc    uint64 // advanced by every rdtsc
}

func newMachine() *machine { return &machine{mem: map[uint64]byte{}} }

func (m *machine) read(a uint64, n int) uint64 {
	var v uint64
	for i := n - 1; i >= 0; i-- {
		v = v<<8 | uint64(m.mem[a+uint64(i)])
	}
	return v
}

func (m *machine) write(a uint64, n int, v uint64) {
	for i := 0; i < n; i++ {
		m.mem[a+uint64(i)] = byte(v >> (8 * i))
	}
}

func (m *machine) load(a uint64, b []byte) {
	for i, c := range b {
		m.mem[a+uint64(i)] = c
	}
}

const (
	flagZF = 1 << 6
	flagSF = 1 << 7
)

type cpu struct {
	m      *machine
	r      [16]uint64
	flags  uint64
	pc     uint64
	gsBase uint64
	tscs   []uint64 // every value rdtsc returned
}

func regIndex(r x86asm.Reg) (int, int) {
	switch {
	case r >= x86asm.RAX && r <= x86asm.R15:
		return int(r - x86asm.RAX), 8
	case r >= x86asm.EAX && r <= x86asm.R15L:
		return int(r - x86asm.EAX), 4
	case r >= x86asm.AX && r <= x86asm.R15W:
		return int(r - x86asm.AX), 2
	}
	panic(fmt.Sprintf("register %v", r))
}

func mask(n int) uint64 {
	if n == 8 {
		return ^uint64(0)
	}
	return 1<<(8*n) - 1
}

func (c *cpu) addr(m x86asm.Mem, next uint64) uint64 {
	var a uint64
	switch {
	case m.Base == x86asm.RIP:
		a = next
	case m.Base != 0:
		i, _ := regIndex(m.Base)
		a = c.r[i]
	}
	if m.Index != 0 {
		i, _ := regIndex(m.Index)
		a += c.r[i] * uint64(m.Scale)
	}
	a += uint64(m.Disp)
	if m.Segment == x86asm.GS {
		a += c.gsBase
	}
	return a
}

// get reads operand a of size n (bytes).
func (c *cpu) get(a x86asm.Arg, n int, next uint64) uint64 {
	switch a := a.(type) {
	case x86asm.Reg:
		i, sz := regIndex(a)
		return c.r[i] & mask(sz)
	case x86asm.Mem:
		return c.m.read(c.addr(a, next), n)
	case x86asm.Imm:
		return uint64(int64(a)) & mask(n)
	}
	panic(fmt.Sprintf("operand %v", a))
}

func (c *cpu) set(a x86asm.Arg, n int, next, v uint64) {
	switch a := a.(type) {
	case x86asm.Reg:
		i, sz := regIndex(a)
		if sz == 4 {
			c.r[i] = v & mask(4) // 32-bit writes zero-extend
		} else {
			c.r[i] = c.r[i]&^mask(sz) | v&mask(sz)
		}
	case x86asm.Mem:
		c.m.write(c.addr(a, next), n, v)
	default:
		panic(fmt.Sprintf("operand %v", a))
	}
}

func (c *cpu) setZS(v uint64, n int) {
	c.flags &^= flagZF | flagSF
	if v&mask(n) == 0 {
		c.flags |= flagZF
	}
	if v>>(8*n-1)&1 != 0 {
		c.flags |= flagSF
	}
}

func (c *cpu) push(v uint64) { c.r[4] -= 8; c.m.write(c.r[4], 8, v) }
func (c *cpu) pop() uint64   { v := c.m.read(c.r[4], 8); c.r[4] += 8; return v }

// step executes the instruction at c.pc.
func (c *cpu) step() error {
	var buf [15]byte
	for i := range buf {
		buf[i] = c.m.mem[c.pc+uint64(i)]
	}
	inst, err := x86dec.Decode(buf[:])
	if err != nil {
		return fmt.Errorf("%#x: %v", c.pc, err)
	}
	next := c.pc + uint64(inst.Len)
	n := inst.DataSize / 8
	if inst.MemBytes > 0 {
		n = inst.MemBytes
	}
	a := inst.Args
	switch inst.Op {
	case x86asm.PUSH:
		c.push(c.get(a[0], 8, next))
	case x86asm.POP:
		c.set(a[0], 8, next, c.pop())
	case x86asm.PUSHFQ:
		c.push(c.flags)
	case x86asm.POPFQ:
		c.flags = c.pop()
	case x86asm.RDTSC:
		c.m.tsc += 7
		c.tscs = append(c.tscs, c.m.tsc)
		c.r[0], c.r[2] = c.m.tsc&mask(4), c.m.tsc>>32
	case x86asm.SHL:
		v := c.get(a[0], n, next) << (c.get(a[1], 1, next) & 63)
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.OR:
		v := c.get(a[0], n, next) | c.get(a[1], n, next)
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.NEG:
		v := -c.get(a[0], n, next)
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.INC:
		v := c.get(a[0], n, next) + 1
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.ADD:
		v := c.get(a[0], n, next) + c.get(a[1], n, next)
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.LEA:
		c.set(a[0], n, next, c.addr(a[1].(x86asm.Mem), next))
	case x86asm.MOV:
		c.set(a[0], n, next, c.get(a[1], n, next))
	case x86asm.TEST:
		c.setZS(c.get(a[0], n, next)&c.get(a[1], n, next), n)
	case x86asm.CMP:
		c.setZS(c.get(a[0], n, next)-c.get(a[1], n, next), n)
	case x86asm.CMPXCHG:
		cur := c.get(a[0], n, next)
		if cur == c.r[0]&mask(n) {
			c.set(a[0], n, next, c.get(a[1], n, next))
			c.flags |= flagZF
		} else {
			c.r[0] = cur
			c.flags &^= flagZF
		}
	case x86asm.XOR:
		v := c.get(a[0], n, next) ^ c.get(a[1], n, next)
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.DEC:
		v := c.get(a[0], n, next) - 1
		c.set(a[0], n, next, v)
		c.setZS(v, n)
	case x86asm.JMP:
		next += uint64(int64(a[0].(x86asm.Rel)))
	case x86asm.JE, x86asm.JNE:
		if (c.flags&flagZF != 0) == (inst.Op == x86asm.JE) {
			next += uint64(int64(a[0].(x86asm.Rel)))
		}
	default:
		return fmt.Errorf("%#x: %v not interpreted", c.pc, inst.Op)
	}
	c.pc = next
	return nil
}

// run executes code loaded at base until pc reaches end.
func (c *cpu) run(base, end uint64) error {
	c.pc = base
	for steps := 0; c.pc != end; steps++ {
		if steps > 10000 || c.pc < base || c.pc > end {
			return fmt.Errorf("runaway at %#x", c.pc)
		}
		if err := c.step(); err != nil {
			return err
		}
	}
	return nil
}

func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
