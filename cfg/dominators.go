package cfg

// Dominators returns the immediate dominator of every block of blocks
// (the function's CFG), as a block index: idom[b] is the last block every
// path to b runs before it. The paths start at a virtual root, len(blocks),
// which enters the function at each of entries (its entry block, and any
// block entered otherwise: an exception fixup's landing, another symbol's
// start); idom[b] is the root for those. Padding blocks, and blocks no
// path from the root reaches, have -1. post is the blocks the root
// reaches, in postorder (a block after every block it dominates).
//
// Cooper, Harvey and Kennedy's iterative algorithm ("A Simple, Fast
// Dominance Algorithm", 2001): the CFGs of functions are small and
// shallow, where it beats Lengauer–Tarjan in practice.
func Dominators(blocks []Block, entries []int) (idom []int, post []int) {
	n := len(blocks)
	root := n
	runs := func(b int) bool { return b >= 0 && b < n && !blocks[b].Padding && blocks[b].N > 0 }
	// Postorder from the root, iteratively: a function can have thousands
	// of blocks in a chain.
	order := make([]int, n+1) // postorder number; -1: not reached
	for i := range order {
		order[i] = -1
	}
	seen := make([]bool, n+1)
	type frame struct{ b, next int }
	succ := func(b, i int) (int, bool) { // the i-th successor of b
		if b == root {
			if i < len(entries) {
				return entries[i], true
			}
			return 0, false
		}
		if i < len(blocks[b].Succs) {
			return blocks[b].Succs[i].To, true
		}
		return 0, false
	}
	stack := []frame{{root, 0}}
	seen[root] = true
	for len(stack) > 0 {
		top := &stack[len(stack)-1]
		s, ok := succ(top.b, top.next)
		if !ok {
			order[top.b] = len(post)
			post = append(post, top.b)
			stack = stack[:len(stack)-1]
			continue
		}
		top.next++
		if runs(s) && !seen[s] {
			seen[s] = true
			stack = append(stack, frame{s, 0})
		}
	}
	isEntry := make([]bool, n)
	for _, e := range entries {
		if runs(e) {
			isEntry[e] = true
		}
	}
	idom = make([]int, n+1)
	for i := range idom {
		idom[i] = -1
	}
	idom[root] = root
	intersect := func(a, b int) int {
		for a != b {
			for order[a] < order[b] {
				a = idom[a]
			}
			for order[b] < order[a] {
				b = idom[b]
			}
		}
		return a
	}
	for changed := true; changed; {
		changed = false
		for i := len(post) - 2; i >= 0; i-- { // reverse postorder, root (last) skipped
			b := post[i]
			nd := -1
			if isEntry[b] {
				nd = root
			}
			for _, p := range blocks[b].Preds {
				if !runs(p) || idom[p] == -1 {
					continue // padding never runs into b; p not reached or not yet placed
				}
				if nd == -1 {
					nd = p
				} else {
					nd = intersect(p, nd)
				}
			}
			if nd != idom[b] {
				idom[b], changed = nd, true
			}
		}
	}
	return idom[:n], post[:len(post)-1]
}
