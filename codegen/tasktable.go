package codegen

import "encoding/binary"

// Virtual timers (KernInst §4: time on a CPU only) need to know, at a
// context switch, whether the task going out or coming in is inside the
// timed region. That is per-task state, kept in a TaskTable in the
// counter heap: Entries pairs of {task_struct pointer, depth}, claimed
// with cmpxchg by the task itself at the region's entry and released at
// its outermost exit. Only the owning task writes its entry's depth and
// releases it; the switch hook only reads keys. The region is timed at
// its outermost level (TaskEnter/TaskExit run Then only when the depth
// goes 0→1 and 1→0), so wall and off-CPU time count the same intervals.
//
// The switch hook (SwitchOffCPU, spliced in __switch_to, where %rdi is
// the task going out and %rsi the one coming in, both on the CPU that
// switches, with interrupts off) keeps a second timer word per region:
// the integral of the number of tasks inside the region and off the CPU.
// Virtual time is wall time minus that (metrics).
//
// A task that cannot claim an entry (more than Entries tasks inside at
// once) is counted in Dropped and not timed. A function also entered
// from an interrupt that arrives between a task's claim and its depth
// update can lose that task's outermost entry; such functions are rare
// and the Dropped count does not show it.

// TaskTable is Entries 16-byte {task, depth} pairs at Addr (8-aligned).
type TaskTable struct {
	Addr    uint64
	Entries int
}

// TaskTableSlots is how many 8-byte counter slots a table of n entries
// takes.
func TaskTableSlots(n int) int { return 2 * n }

func (t TaskTable) end() uint64 { return t.Addr + uint64(16*t.Entries) }

// TaskEnter: the current task enters the region; on its outermost entry
// Then runs (a TimerEnter of the wall word).
type TaskEnter struct {
	Table       TaskTable
	CurrentTask int32  // per-CPU offset of current_task
	Dropped     uint64 // counter of tasks the full table turned away
	Then        []Snippet
}

// TaskExit: the current task leaves the region; on its outermost exit
// Then runs (a TimerExit of the wall word) and the entry is released.
// A task not in the table (it entered before the probe) is ignored.
type TaskExit struct {
	Table       TaskTable
	CurrentTask int32
	Then        []Snippet
}

// OffCPU is one region's table and its off-CPU timer word.
type OffCPU struct {
	Table TaskTable
	Word  uint64
}

// SwitchOffCPU is the switch hook: for each region, the task going out
// (%rdi), if inside, enters the off-CPU word; the task coming in (%rsi),
// if inside, leaves it.
type SwitchOffCPU struct{ Regions []OffCPU }

// The registers the table snippets reserve: RAX, RCX and RDX for the
// timers, RDX and RAX as temporaries, and RDI and RSI, which the switch
// hook reads (reserving them keeps them out of the scratch registers).
const tableFixed = 1<<RAX | 1<<RCX | 1<<RDX | 1<<RSI | 1<<RDI

func thenNeeds(then []Snippet) Needs {
	n := Needs{Fixed: tableFixed, Flags: true}
	for _, s := range then {
		n = n.union(s.Needs())
	}
	return n
}

func (e TaskEnter) Needs() Needs {
	n := thenNeeds(e.Then)
	n.Regs = max(n.Regs, 2)
	return n
}

func (e TaskExit) Needs() Needs {
	n := thenNeeds(e.Then)
	n.Regs = max(n.Regs, 2)
	return n
}

func (s SwitchOffCPU) Needs() Needs {
	return Needs{Regs: 1, Fixed: tableFixed, Flags: true}
}

// jccBack emits a jcc rel32 back to offset to of a's code.
func jccBack(a *Asm, cc byte, to int) {
	a.Raw(0x0f, 0x80|cc&0xf)
	a.code = binary.LittleEndian.AppendUint32(a.code, uint32(int32(to-(len(a.code)+4))))
}

// leaRIP: lea target(%rip),%r.
func leaRIP(a *Asm, r Reg, target uint64) {
	a.ripOp([]byte{rexW(r, 0)}, []byte{0x8d}, byte(r), target, nil)
}

// cmpRegMem: cmp %r,disp(%base).
func cmpRegMem(a *Asm, r, base Reg, disp int32) {
	a.Raw(rexW(r, base), 0x39)
	a.memOp(byte(r), base, disp)
}

// scan leaves in ptr the table entry whose key is task, branching to the
// returned label if found; it falls through when not found. Clobbers
// RAX and flags.
func scan(a *Asm, t TaskTable, ptr, task Reg) Label {
	leaRIP(a, ptr, t.Addr)
	leaRIP(a, RAX, t.end())
	loop := a.Len()
	cmpRegMem(a, task, ptr, 0)
	found := a.JccForward(CondE)
	a.Raw(rexW(0, ptr), 0x83, 0xc0|byte(ptr)&7, 16)            // add $16,%ptr
	a.Raw(rexW(RAX, ptr), 0x39, 0xc0|byte(RAX)<<3|byte(ptr)&7) // cmp %rax,%ptr
	jccBack(a, CondNE, loop)
	return found
}

func emitThen(a *Asm, then []Snippet, scratch []Reg) {
	for _, s := range then {
		s.Emit(a, scratch[:s.Needs().Regs])
	}
}

func (e TaskEnter) Emit(a *Asm, scratch []Reg) {
	ptr, task := scratch[0], scratch[1]
	a.MovqGS(task, e.CurrentTask)
	found := scan(a, e.Table, ptr, task)
	// Not in the table: claim a free entry (key 0).
	leaRIP(a, ptr, e.Table.Addr)
	claim := a.Len()
	a.Raw(0x31, 0xc0) // xor %eax,%eax
	a.Raw(0xf0, rexW(task, ptr), 0x0f, 0xb1)
	a.memOp(byte(task), ptr, 0) // lock cmpxchg %task,(%ptr)
	claimed := a.JccForward(CondE)
	a.Raw(rexW(0, ptr), 0x83, 0xc0|byte(ptr)&7, 16) // add $16,%ptr
	leaRIP(a, RDX, e.Table.end())
	a.Raw(rexW(RDX, ptr), 0x39, 0xc0|byte(RDX)<<3|byte(ptr)&7) // cmp %rdx,%ptr
	jccBack(a, CondNE, claim)
	a.LockIncq(e.Dropped) // the table is full
	full := a.JmpForward()
	a.Bind(claimed)
	// A fresh entry's depth is 1 whatever a released entry left there.
	a.Raw(rexW(0, ptr), 0xc7)
	a.memOp(0, ptr, 8)
	a.Raw(1, 0, 0, 0) // movq $1,8(%ptr)
	outer := a.JmpForward()
	a.Bind(found)
	a.Raw(rexW(0, ptr), 0xff)
	a.memOp(0, ptr, 8) // incq 8(%ptr)
	done := a.JmpForward()
	a.Bind(outer)
	emitThen(a, e.Then, scratch)
	a.Bind(done)
	a.Bind(full)
}

func (e TaskExit) Emit(a *Asm, scratch []Reg) {
	ptr, task := scratch[0], scratch[1]
	a.MovqGS(task, e.CurrentTask)
	found := scan(a, e.Table, ptr, task)
	absent := a.JmpForward()
	a.Bind(found)
	a.Raw(rexW(0, ptr), 0xff)
	a.memOp(1, ptr, 8) // decq 8(%ptr)
	inner := a.JccForward(CondNE)
	emitThen(a, e.Then, scratch)
	a.Raw(rexW(0, ptr), 0xc7)
	a.memOp(0, ptr, 0)
	a.Raw(0, 0, 0, 0) // movq $0,(%ptr): released
	a.Bind(inner)
	a.Bind(absent)
}

func (s SwitchOffCPU) Emit(a *Asm, scratch []Reg) {
	ptr := scratch[0]
	for _, r := range s.Regions {
		found := scan(a, r.Table, ptr, RDI) // the task going out
		absent := a.JmpForward()
		a.Bind(found)
		TimerEnter{Word: r.Word}.Emit(a, nil)
		a.Bind(absent)
		found = scan(a, r.Table, ptr, RSI) // the task coming in
		absent = a.JmpForward()
		a.Bind(found)
		TimerExit{Word: r.Word}.Emit(a, nil)
		a.Bind(absent)
	}
}
