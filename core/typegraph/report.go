package typegraph

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/kinst/kinst/core/typeid"
)

// PassReport is the account after one pass, as the seed reports it.
type PassReport struct {
	Pass        string `json:"pass"`
	Known       int    `json:"known"`
	Conjectured int    `json:"conjectured"`
	Conflicts   int    `json:"conflicts"`
	Unmarked    int    `json:"unmarked"`
	NS          int64  `json:"ns"`
}

// Reach is the untyped object whose type would identify the most
// others.
type Reach struct {
	Object string `json:"object"`
	Reach  int    `json:"reach"`
	Cache  string `json:"cache,omitempty"`
}

// CacheReport is one cache's objects and their types.
type CacheReport struct {
	Name    string         `json:"name"`
	Objects int            `json:"objects"`
	Typed   int            `json:"typed"`
	Types   map[string]int `json:"types"`
	ByCache int            `json:"-"` // typed by the cache itself
}

// HeldOut is the inference measured on a cache treated as untyped.
type HeldOut struct {
	Cache   string `json:"cache"`
	Objects int    `json:"objects"`
	Typed   int    `json:"typed"`
	Correct int    `json:"correct"`
	// Beyond the shape: the type the cache holds, and the wrong
	// types given, by count.
	Type  string         `json:"type"`
	Wrong map[string]int `json:"wrong,omitempty"`
}

// Report is `kinst core DUMP typegraph --json`.
type Report struct {
	Objects       int           `json:"objects"`
	Typed         int           `json:"typed"`
	ByCache       int           `json:"by_cache"`
	ByHand        int           `json:"by_hand,omitempty"` // istype: set by hand (typed = by_cache + by_hand + propagated)
	Propagated    int           `json:"propagated"`
	Conflicts     int           `json:"conflicts"`
	Untyped       int           `json:"untyped"`
	Passes        []PassReport  `json:"passes"`
	GreatestReach *Reach        `json:"greatest_reach"`
	Caches        []CacheReport `json:"caches"`
	HeldOut       []HeldOut     `json:"held_out"`
	// Beyond the shape.
	Roots     int `json:"roots"`      // variables read for pointers
	Claims    int `json:"claims"`     // pointers into objects of unknown type
	Arrays    int `json:"arrays"`     // objects typed as arrays
	ReadFails int `json:"read_fails"` // slabs whose memory could not be read
}

// Report is the graph's account.
func (g *Graph) Report() *Report { return &g.rep }

func (g *Graph) report() {
	r := &g.rep
	r.Objects, r.Roots, r.Claims, r.ReadFails = g.objects, len(g.roots), len(g.claims), g.readFails
	per := map[int]*CacheReport{}
	held := map[int]*HeldOut{}
	for c, ct := range g.held {
		ho := &HeldOut{Cache: c.Name, Type: ct.Name, Wrong: map[string]int{}}
		held[g.cacheIdx[c]] = ho
	}
	for n := range g.mark {
		nn := int32(n)
		si := g.nodeSlab[n]
		s := g.slabs[si]
		if s.Free(int(nn - g.first[si])) {
			continue
		}
		cix := g.cacheIdx[s.Cache]
		cr := per[cix]
		if cr == nil {
			cr = &CacheReport{Name: s.Cache.Name, Types: map[string]int{}}
			per[cix] = cr
		}
		cr.Objects++
		m := g.mark[n]
		if m != Unmarked {
			cr.Typed++
			cr.Types[g.typeName(nn)]++
			r.Typed++
			switch m {
			case ByCache:
				r.ByCache++
				cr.ByCache++
			case Hand:
				r.ByHand++
			default:
				r.Propagated++
			}
			if g.arr[n] > 0 {
				r.Arrays++
			}
		}
		if _, ok := g.conf[nn]; ok {
			r.Conflicts++
		}
		if ho := held[cix]; ho != nil {
			ho.Objects++
			if m != Unmarked {
				ho.Typed++
				if tt, ok := g.trueType[s.Cache]; ok && tt == g.typ[n] && g.arr[n] == 0 {
					ho.Correct++
				} else {
					ho.Wrong[g.typeName(nn)]++
				}
			}
		}
	}
	r.Untyped = r.Objects - r.Typed
	r.Caches = []CacheReport{}
	for i := range g.caches {
		if cr := per[i]; cr != nil {
			r.Caches = append(r.Caches, *cr)
		}
	}
	r.HeldOut = []HeldOut{}
	for _, ho := range held {
		r.HeldOut = append(r.HeldOut, *ho)
	}
	sort.Slice(r.HeldOut, func(i, j int) bool { return r.HeldOut[i].Cache < r.HeldOut[j].Cache })
	r.GreatestReach = g.greatestReach()
}

// reachCandidates bounds the untyped objects whose reach is computed in
// full: those with the most pointers to other untyped objects.
const reachCandidates = 64

// greatestReach finds the untyped object from which the most untyped
// objects are reachable through pointer-sized words (the objects its
// type, once known, could identify): the seed's hint of which object to
// type by hand. The reach of each untyped object's direct successors is
// counted, and the transitive reach computed for the best candidates.
func (g *Graph) greatestReach() *Reach {
	succ := map[int32][]int32{}
	for n, m := range g.mark {
		nn := int32(n)
		if m != Unmarked || g.isFree(nn) {
			continue
		}
		b := g.bytes(nn)
		seen := map[int32]bool{}
		for o := 0; o+8 <= len(b); o += 8 {
			v := binary.LittleEndian.Uint64(b[o:])
			if v < 0xffff800000000000 {
				continue
			}
			if t, _, ok := g.node(v); ok && t != nn && g.mark[t] == Unmarked && !seen[t] {
				seen[t] = true
				succ[nn] = append(succ[nn], t)
			}
		}
	}
	if len(succ) == 0 {
		return nil
	}
	cands := make([]int32, 0, len(succ))
	for n := range succ {
		cands = append(cands, n)
	}
	sort.Slice(cands, func(i, j int) bool {
		if len(succ[cands[i]]) != len(succ[cands[j]]) {
			return len(succ[cands[i]]) > len(succ[cands[j]])
		}
		return cands[i] < cands[j]
	})
	best, bestN := int32(-1), -1
	for _, c := range cands[:min(len(cands), reachCandidates)] {
		seen := map[int32]bool{c: true}
		stack := []int32{c}
		for len(stack) > 0 {
			x := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, y := range succ[x] {
				if !seen[y] {
					seen[y] = true
					stack = append(stack, y)
				}
			}
		}
		if len(seen)-1 > bestN {
			best, bestN = c, len(seen)-1
		}
	}
	return &Reach{Object: fmt.Sprintf("%#x", g.addr(best)), Reach: bestN, Cache: g.slabs[g.nodeSlab[best]].Cache.Name}
}

func (g *Graph) isFree(n int32) bool {
	si := g.nodeSlab[n]
	return g.slabs[si].Free(int(n - g.first[si]))
}

// Typing is what the graph says of one object.
type Typing struct {
	Object uint64
	Type   string // "S" or "S[n]"
	Member string // the member path at the address asked about
	Mark   Mark
	Pass   string // the pass that typed it ("cache" for its cache)
	// Chain is how the type was inferred: the steps from a cache-typed
	// object or a variable to this object.
	Chain []Step
	// Conflicts are the claims that contradict the type, each with its
	// own chain.
	Conflicts [][]Step
}

// Step is one pointer of a chain of inference.
type Step = typeid.Step

// TypeAt is the graph's type for the object holding addr.
func (g *Graph) TypeAt(addr uint64) (*Typing, bool) {
	n, off, ok := g.node(addr)
	if !ok || g.mark[n] == Unmarked {
		return nil, false
	}
	t := &Typing{Object: g.addr(n), Type: g.typeName(n), Mark: g.mark[n], Pass: passNames[g.pass[n]]}
	switch g.mark[n] {
	case ByCache:
		t.Pass = PassCache
	case Hand:
		t.Pass = "istype"
	}
	ti := g.ts.info(g.typ[n])
	mo := uint64(off)
	switch {
	case g.typ[n] == g.ts.str:
		t.Member = fmt.Sprintf("%s[%d]", ti.name, mo) // a character of the string
	case g.arr[n] > 0 && ti.size > 0:
		t.Member = fmt.Sprintf("%s[%d]", ti.name, mo/uint64(ti.size))
		t.Member += typeid.MemberPath(ti.t, mo%uint64(ti.size))[len(ti.name):]
	default:
		t.Member = typeid.MemberPath(ti.t, mo)
	}
	t.Chain = g.chain(g.from[n])
	for _, c := range g.conf[n] {
		t.Conflicts = append(t.Conflicts, g.chain(c))
	}
	return t, true
}

// maxChain bounds a chain of inference.
const maxChain = 64

// chain follows claim c back to a cache type or a variable.
func (g *Graph) chain(c int32) []Step {
	var out []Step
	for i := 0; c >= 0 && i < maxChain; i++ {
		cl := g.claims[c]
		st := Step{Type: g.ts.infos[cl.typ].name, To: fmt.Sprintf("%#x+%#x", g.addr(cl.tgt), cl.toff)}
		if cl.src < 0 {
			r := g.roots[-1-cl.src]
			st.From = r.name
			st.Member = typeid.MemberPath(r.typ, uint64(cl.srcOff))
			out = append(out, st)
			break
		}
		st.From = fmt.Sprintf("%#x (%s)", g.addr(cl.src), g.slabs[g.nodeSlab[cl.src]].Cache.Name)
		if t := g.typ[cl.src]; t >= 0 {
			ti := g.ts.info(t)
			off := uint64(cl.srcOff)
			if g.arr[cl.src] > 0 && ti.size > 0 {
				off %= uint64(ti.size)
			}
			st.Member = typeid.MemberPath(ti.t, off)
		}
		out = append(out, st)
		if g.mark[cl.src] == ByCache || g.mark[cl.src] == Hand {
			break
		}
		c = g.from[cl.src]
	}
	// From the known end to the object.
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// Conflict is an object with contradicting claims.
type Conflict struct {
	Object    uint64
	Cache     string
	Type      string
	Chain     []Step
	Conflicts [][]Step
}

// Conflicts lists up to max objects with conflicts, by address.
func (g *Graph) Conflicts(max int) []Conflict {
	ns := make([]int32, 0, len(g.conf))
	for n := range g.conf {
		ns = append(ns, n)
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
	var out []Conflict
	for _, n := range ns[:min(len(ns), max)] {
		t, _ := g.TypeAt(g.addr(n))
		c := Conflict{Object: g.addr(n), Cache: g.slabs[g.nodeSlab[n]].Cache.Name}
		if t != nil {
			c.Type, c.Chain, c.Conflicts = t.Type, t.Chain, t.Conflicts
		}
		out = append(out, c)
	}
	return out
}
