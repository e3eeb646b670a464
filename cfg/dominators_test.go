package cfg

import (
	"math/rand"
	"reflect"
	"testing"
)

// graph makes blocks from successor lists (each block one instruction).
func graph(succs [][]int, padding ...int) []Block {
	bs := make([]Block, len(succs))
	for b, ss := range succs {
		bs[b].Index, bs[b].First, bs[b].N = b, b, 1
		for _, s := range ss {
			bs[b].Succs = append(bs[b].Succs, Edge{To: s})
			bs[s].Preds = append(bs[s].Preds, b)
		}
	}
	for _, p := range padding {
		bs[p].Padding = true
	}
	return bs
}

func TestDominators(t *testing.T) {
	const R = -2 // the root, in want
	for _, tc := range []struct {
		name    string
		succs   [][]int
		padding []int
		entries []int
		want    []int // R: the root
	}{
		{"diamond", [][]int{{1, 2}, {3}, {3}, {}}, nil, []int{0}, []int{R, 0, 0, 0}},
		{"if-then", [][]int{{1, 2}, {2}, {}}, nil, []int{0}, []int{R, 0, 0}},
		{"loop", [][]int{{1}, {2, 3}, {1}, {}}, nil, []int{0}, []int{R, 0, 1, 1}},
		// A second entry (a fixup's landing) at 2: 0 no longer dominates 2 or 3.
		{"landing", [][]int{{1, 2}, {2}, {3}, {}}, nil, []int{0, 2}, []int{R, 0, R, 2}},
		// 3 is reached by nothing; 4 is padding that falls into 2.
		{"unreached", [][]int{{1}, {2}, {}, {2}, {2}}, []int{4}, []int{0}, []int{R, 0, 1, -1, -1}},
	} {
		bs := graph(tc.succs, tc.padding...)
		idom, post := Dominators(bs, tc.entries)
		for i, d := range idom {
			if d == len(bs) {
				idom[i] = R
			}
		}
		if !reflect.DeepEqual(idom, tc.want) {
			t.Errorf("%s: idom %v, want %v", tc.name, idom, tc.want)
		}
		checkPostorder(t, tc.name, bs, idom, post)
	}
}

// checkPostorder: every reached block once, each after every block it
// dominates.
func checkPostorder(t *testing.T, name string, bs []Block, idom, post []int) {
	t.Helper()
	at := map[int]int{}
	for i, b := range post {
		if _, dup := at[b]; dup {
			t.Fatalf("%s: %d twice in postorder %v", name, b, post)
		}
		at[b] = i
	}
	for b, d := range idom {
		_, in := at[b]
		if in != (d != -1) {
			t.Errorf("%s: block %d in postorder %v, idom %d", name, b, in, d)
		}
		if d >= 0 && d < len(bs) && at[d] < at[b] {
			t.Errorf("%s: %d before the block it dominates, %d, in %v", name, d, b, post)
		}
	}
}

// Against the definition, on random graphs: d dominates b when b cannot
// be reached from the entries without d; the immediate dominator is the
// strict dominator every other strict dominator dominates.
func TestDominatorsDefinition(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for iter := 0; iter < 500; iter++ {
		n := 1 + rng.Intn(12)
		succs := make([][]int, n)
		for b := range succs {
			for k := rng.Intn(3); k > 0; k-- {
				succs[b] = append(succs[b], rng.Intn(n))
			}
		}
		var padding []int
		if n > 2 && rng.Intn(4) == 0 {
			padding = []int{n - 1}
		}
		entries := []int{0}
		if n > 1 && rng.Intn(3) == 0 {
			entries = append(entries, rng.Intn(n))
		}
		bs := graph(succs, padding...)
		idom, post := Dominators(bs, entries)
		reach := func(without int) []bool {
			r := make([]bool, n)
			var walk func(b int)
			walk = func(b int) {
				if b == without || r[b] || bs[b].Padding {
					return
				}
				r[b] = true
				for _, e := range bs[b].Succs {
					walk(e.To)
				}
			}
			for _, e := range entries {
				walk(e)
			}
			return r
		}
		all := reach(-1)
		doms := func(d, b int) bool { return d == b || !reach(d)[b] }
		for b := 0; b < n; b++ {
			if !all[b] {
				if idom[b] != -1 {
					t.Fatalf("graph %v entries %v: unreached %d has idom %d", succs, entries, b, idom[b])
				}
				continue
			}
			want := n // the root, unless a block strictly dominates b
			for d := 0; d < n; d++ {
				if d == b || !doms(d, b) {
					continue
				}
				// The immediate one: dominated by every other strict dominator.
				imm := true
				for d2 := 0; d2 < n; d2++ {
					if d2 != b && d2 != d && doms(d2, b) && !doms(d2, d) {
						imm = false
					}
				}
				if imm {
					want = d
				}
			}
			if idom[b] != want {
				t.Fatalf("graph %v padding %v entries %v: idom[%d] = %d, want %d (all %v)", succs, padding, entries, b, idom[b], want, idom)
			}
		}
		checkPostorder(t, "random", bs, idom, post)
	}
}
