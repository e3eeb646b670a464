package cfg

import (
	"fmt"

	"golang.org/x/arch/x86/x86asm"
)

// A region is a set of a function's instructions (the code of a range of
// source lines) timed as a function is: a thread is inside from when
// control passes into it until control passes out. The timer is one word
// counting the threads inside (codegen.TimerEnter/TimerExit), switched
// on or off by snippets at instructions, and a snippet runs the same on
// every edge into its instruction. So the plan gives every instruction a
// state, the timer on or off while it runs, such that all the
// predecessors of an instruction agree (the snippet there switches from
// their state to its own). Instructions whose states must agree form
// classes (union-find). A class is off when it holds the caller (before
// the entry), a call outside the region (its callee's time is not the
// region's) or an instruction that leaves the function (ret, tail call:
// off as a function timer's exits are); on when it holds a call inside
// the region; else on when most of its instructions are the region's
// (the others are timed with it: say, the branch that skips a
// conditional call), off otherwise (the region's few are left out: say,
// the jmp that ends an if's arm). A class that must be both is a region
// no timer can follow exactly: refused.
//
// Calls are counted apart from the switch: at each of the region's
// instructions that only code outside it leads to, when a path from the
// function's entry (or from code the entry does not reach, entered from
// another function: a .cold part's) reaches it without passing through
// the region (not when the thread left for an island of other lines and
// came back). An
// instruction of the region entered both from inside and from outside
// counts the entries whose branch outside has no other way to go; a
// branch that may go elsewhere is not counted there (calls then fall
// short).

// RegionSite is one instruction a region's timer is spliced at: where a
// call is counted, and where the timer is switched on (Enter) or off
// (Exit).
type RegionSite struct {
	Index       int // instruction index in the function
	Count       bool
	Enter, Exit bool
}

// RegionError is a region a timer cannot follow: At is the address of an
// instruction where, Why says how.
type RegionError struct {
	At  uint64
	Why string
}

func (e *RegionError) Error() string { return fmt.Sprintf("%#x: %s", e.At, e.Why) }

// Region plans the timer sites of the region in (by instruction index) of
// f split into blocks. A region the timer cannot follow is a
// *RegionError: a call outside it (or the caller, or a return) and an
// instruction of it lead to one instruction; or code timed with it
// branches out of the function other than by a tail call (to a .cold
// part, whose way back is not known here).
func Region(f *Function, blocks []Block, in func(i int) bool) ([]RegionSite, error) {
	n := len(f.Insns)
	caller := n // a node for the caller, before the entry
	live := make([]bool, n)
	succs := make([][]int, n)
	leaves := make([]bool, n) // control leaves the function after it
	found := false
	for _, b := range blocks {
		if b.Padding {
			continue
		}
		for i := b.First; i < b.First+b.N; i++ {
			live[i] = true
			found = found || in(i)
			if i < b.First+b.N-1 {
				succs[i] = []int{i + 1}
			}
		}
		last := b.First + b.N - 1
		for _, e := range b.Succs {
			succs[last] = append(succs[last], blocks[e.To].First)
		}
		switch b.Exit {
		case Return, TailCall, IndirectJump:
			leaves[last] = true
		}
	}
	if !found {
		return nil, &RegionError{At: f.Addr, Why: "no instruction of " + f.Name + " is in the range"}
	}
	// What the entry reaches: other code is entered by jumps from other
	// functions (a .cold part's loop, entered from the hot part).
	reached := make([]bool, n)
	for stack := []int{0}; len(stack) > 0; {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i < n && !reached[i] && live[i] {
			reached[i] = true
			stack = append(stack, succs[i]...)
		}
	}
	preds := make([][]int, n+1)
	preds[0] = []int{caller}
	for i, ss := range succs {
		for _, s := range ss {
			preds[s] = append(preds[s], i)
		}
	}
	// Classes of instructions whose states must be equal: the
	// predecessors of each instruction.
	parent := make([]int, n+1)
	for i := range parent {
		parent[i] = i
	}
	find := func(i int) int {
		for parent[i] != i {
			parent[i] = parent[parent[i]]
			i = parent[i]
		}
		return i
	}
	for s := 0; s < n; s++ {
		for _, p := range preds[s][min(1, len(preds[s])):] {
			parent[find(p)] = find(preds[s][0])
		}
	}
	// What each class must be: on (calls of the region), off (calls
	// outside it, returns, the caller), with a witness each for the
	// refusal; and how many of the region's and other instructions it
	// holds, for the classes free to be either.
	hardOn, hardOff := map[int]int{}, map[int]int{}
	inside, outside := map[int]int{}, map[int]int{}
	force := func(m map[int]int, i int) {
		if _, ok := m[find(i)]; !ok {
			m[find(i)] = i
		}
	}
	force(hardOff, caller)
	isCall := func(i int) bool { return f.Insns[i].Inst.Op == x86asm.CALL }
	for i := 0; i < n; i++ {
		if !live[i] {
			continue
		}
		switch {
		case leaves[i]:
			force(hardOff, i)
		case in(i) && isCall(i):
			force(hardOn, i)
		case isCall(i):
			force(hardOff, i)
		}
		if in(i) && !leaves[i] {
			inside[find(i)]++
		} else {
			outside[find(i)]++
		}
	}
	for k, a := range hardOn {
		b, ok := hardOff[k]
		if !ok {
			continue
		}
		what := fmt.Sprintf("the call at %#x, outside the range,", f.Insns[min(b, n-1)].Addr)
		switch {
		case b == caller:
			what = "the function's entry"
		case leaves[b]:
			what = fmt.Sprintf("the return at %#x", f.Insns[b].Addr)
		}
		return nil, &RegionError{At: f.Insns[a].Addr, Why: fmt.Sprintf("the range's call here and %s lead to the same instruction, which a timer cannot tell apart", what)}
	}
	on := map[int]bool{}
	for k, m := range inside {
		_, hon := hardOn[k]
		_, hoff := hardOff[k]
		on[k] = hon || !hoff && m > outside[k]
	}
	state := func(i int) bool { return on[find(i)] }
	timed := func(i int) bool { return i != caller && in(i) && state(i) } // the region's, timed
	for i := 0; i < n; i++ {
		if live[i] && state(i) && !leaves[i] {
			if t, ok := outsideBranch(f, &f.Insns[i]); ok {
				return nil, &RegionError{At: f.Insns[i].Addr, Why: fmt.Sprintf("code timed with the range branches out of %s to %#x (a .cold part?), and where that comes back is not known", f.Name, t)}
			}
		}
	}
	sites := map[int]*RegionSite{}
	site := func(i int) *RegionSite {
		if sites[i] == nil {
			sites[i] = &RegionSite{Index: i}
		}
		return sites[i]
	}
	for s := 0; s < n; s++ {
		if !live[s] || len(preds[s]) == 0 {
			continue
		}
		was, is := state(preds[s][0]), state(s)
		switch {
		case !was && is:
			site(s).Enter = true
		case was && !is:
			site(s).Exit = true
		}
		if !timed(s) {
			continue
		}
		// Calls: where control comes into the region's timed code
		// from outside it, on a path from the entry that avoids it.
		var from []int
		for _, p := range preds[s] {
			if !timed(p) {
				from = append(from, p)
			}
		}
		if len(from) == 0 || !fromEntry(from, preds, timed, caller, reached) {
			continue
		}
		if len(from) == len(preds[s]) {
			site(s).Count = true
			continue
		}
		for _, p := range from {
			if p != caller && len(succs[p]) == 1 {
				site(p).Count = true
			}
		}
	}
	if len(sites) == 0 || !anyTimed(n, live, timed) {
		return nil, &RegionError{At: f.Addr, Why: "each of the range's instructions in " + f.Name + " ends an arm of a branch that others join, which a timer cannot tell apart: widen the range"}
	}
	out := make([]RegionSite, 0, len(sites))
	for i := 0; i < n; i++ {
		if st := sites[i]; st != nil {
			out = append(out, *st)
		}
	}
	return out, nil
}

// anyTimed reports whether the plan times some live instruction of the
// region.
func anyTimed(n int, live []bool, timed func(int) bool) bool {
	for i := 0; i < n; i++ {
		if live[i] && timed(i) {
			return true
		}
	}
	return false
}

// fromEntry reports whether some path from the function's entry (the
// caller), or from code the entry does not reach (entered from another
// function), reaches one of from without passing through the region.
func fromEntry(from []int, preds [][]int, in func(int) bool, caller int, reached []bool) bool {
	seen := map[int]bool{}
	stack := append([]int(nil), from...)
	for len(stack) > 0 {
		i := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if i == caller || !in(i) && !reached[i] {
			return true
		}
		if seen[i] || in(i) {
			continue
		}
		seen[i] = true
		stack = append(stack, preds[i]...)
	}
	return false
}

// outsideBranch is the target of a direct jump or conditional branch
// that leaves f, if in is one.
func outsideBranch(f *Function, in *Instruction) (uint64, bool) {
	op := in.Inst.Op
	if op == x86asm.CALL || len(in.Inst.Args) == 0 {
		return 0, false
	}
	if !(op == x86asm.JMP || isJcc(op)) {
		return 0, false
	}
	rel, ok := in.Inst.Args[0].(x86asm.Rel)
	if !ok {
		return 0, false
	}
	t := uint64(int64(in.End()) + int64(rel))
	if t >= f.Addr && t < f.End {
		return 0, false
	}
	return t, true
}
