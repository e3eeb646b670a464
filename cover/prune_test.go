package cover

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
)

const pruneBase = 0x401000

// pruneFuncs are hand-assembled functions, their blocks noted.
var pruneFuncs = map[string][]byte{
	// B0 test/je → B1 (mov, jmp) or B2 (mov), both into B3 (ret): B0 is
	// known from B1 and B2, each entered only from it (it dominates them).
	"diamond": {
		0x85, 0xff, // 0x00 test %edi,%edi   B0
		0x74, 0x07, // 0x02 je 0x0b
		0xb8, 0x01, 0x00, 0x00, 0x00, // 0x04 mov $1,%eax  B1
		0xeb, 0x05, // 0x09 jmp 0x10
		0xb8, 0x02, 0x00, 0x00, 0x00, // 0x0b mov $2,%eax  B2
		0xc3, // 0x10 ret                 B3
	},
	// The same with a call in B0: a task asleep in the callee has run B0
	// and neither successor, so B0 keeps its probe.
	"calls": {
		0xe8, 0x00, 0x00, 0x00, 0x00, // 0x00 call next   B0
		0x85, 0xff, // 0x05 test
		0x74, 0x07, // 0x07 je 0x10
		0xb8, 0x01, 0x00, 0x00, 0x00, // 0x09          B1
		0xeb, 0x05, // 0x0e jmp 0x15
		0xb8, 0x02, 0x00, 0x00, 0x00, // 0x10          B2
		0xc3, // 0x15                   B3
	},
	// A chain: B0 je → B5 or B1; B1 je → B4 or B2. B1 is inferred from
	// B2 and B4 (padding, B3, falls into B4 but never runs), B0 from B1
	// (inferred) and B5.
	"chain": {
		0x85, 0xff, // 0x00 test          B0
		0x74, 0x0a, // 0x02 je 0x0e
		0x85, 0xf6, // 0x04 test          B1 (pred B0)
		0x74, 0x05, // 0x06 je 0x0d
		0x31, 0xc0, // 0x08 xor           B2 (pred B1)
		0xc3,       // 0x0a ret
		0x90, 0x90, // 0x0b nop nop       B3, padding
		0xc3, // 0x0d ret                 B4 (pred B1)
		0xc3, // 0x0e ret                 B5 (pred B0)
	},
	// B0 je → B2, or on into B1, which falls into B2: B2 has two
	// predecessors, but every path to it runs B0 (B0 dominates it), so
	// B0 is known from B1 and B2.
	"ifthen": {
		0x85, 0xff, // 0x00 test %edi,%edi   B0
		0x74, 0x05, // 0x02 je 0x09
		0xb8, 0x01, 0x00, 0x00, 0x00, // 0x04 mov $1,%eax  B1
		0xc3, // 0x09 ret                 B2
	},
	// The same, where another symbol starts at B2 (a jump from another
	// function may enter there): B0 no longer dominates it.
	"ifthen-sym": {
		0x85, 0xff, // 0x00 test %edi,%edi   B0
		0x74, 0x05, // 0x02 je 0x09
		0xb8, 0x01, 0x00, 0x00, 0x00, // 0x04 mov $1,%eax  B1
		0xc3, // 0x09 ret                 B2, also ifthen_tail
	},
	// A diamond whose B1 leaves by a computed goto (jmp *%rax, as the BPF
	// interpreter does): it may enter any block, B2 included, so nothing
	// is inferred.
	"goto": {
		0x85, 0xff, // 0x00 test %edi,%edi   B0
		0x74, 0x07, // 0x02 je 0x0b
		0xb8, 0x01, 0x00, 0x00, 0x00, // 0x04 mov $1,%eax  B1
		0xff, 0xe0, // 0x09 jmp *%rax
		0xc3, // 0x0b ret                 B2
	},
}

// pruneSyms are the fixtures' other symbols: name → offset.
var pruneSyms = map[string]map[string]uint64{"ifthen-sym": {"ifthen_tail": 0x09}}

func pruneFunc(t *testing.T, name string) *splice.Func {
	t.Helper()
	fn, err := cfg.Decode(name, "", pruneBase, pruneFuncs[name])
	if err != nil {
		t.Fatal(err)
	}
	ks := []kernel.Symbol{{Name: name, Addr: pruneBase, Type: 'T'}}
	for n, off := range pruneSyms[name] {
		ks = append(ks, kernel.Symbol{Name: n, Addr: pruneBase + off, Type: 'T'})
	}
	syms := kernel.NewSymbols(ks)
	return (&splice.Facts{Symbols: syms, Text: memText(pruneFuncs[name]), Process: true}).Func(fn, nil)
}

type memText []byte

func (m memText) Read(addr uint64, b []byte) error {
	if addr < pruneBase || addr+uint64(len(b)) > pruneBase+uint64(len(m)) {
		return fmt.Errorf("unmapped %#x", addr)
	}
	copy(b, m[addr-pruneBase:])
	return nil
}

func TestInferable(t *testing.T) {
	all := func(int) bool { return true }
	for _, tc := range []struct {
		fn     string
		probed func(int) bool
		want   map[int][]int
	}{
		{"diamond", all, map[int][]int{0: {1, 2}}},
		{"chain", all, map[int][]int{0: {1, 5}, 1: {2, 4}}},
		{"calls", all, map[int][]int{}},
		{"ifthen", all, map[int][]int{0: {1, 2}}},
		{"ifthen-sym", all, map[int][]int{}},
		{"goto", all, map[int][]int{}},
		// A successor with no probe of its own: nothing to infer from.
		{"diamond", func(b int) bool { return b != 2 }, map[int][]int{}},
	} {
		f := pruneFunc(t, tc.fn)
		got := Inferable(f, tc.probed)
		for _, v := range got {
			slices.Sort(v)
		}
		if !reflect.DeepEqual(got, tc.want) {
			var desc []string
			for _, b := range f.Blocks {
				desc = append(desc, fmt.Sprintf("B%d@+%#x succs %v preds %v exit %v", b.Index, b.Start(f.Fn)-pruneBase, b.Succs, b.Preds, b.Exit))
			}
			t.Errorf("%s: %v, want %v\n%s", tc.fn, got, tc.want, strings.Join(desc, "\n"))
		}
	}
}

// pathEngine is a cover.Engine whose probes "run" when a test says which
// blocks executed: it splices nothing (the live tests do), so that every
// path through a function can be played under a pruned and an unpruned
// Set and their reports compared.
type pathEngine struct {
	at   map[*engine.Request]uint64 // the probe's address
	ran  map[uint64]bool            // addresses executed so far
	fail map[uint64]bool            // probes refused at these addresses
	// stuck: probes at these addresses cannot be removed; removed counts
	// the removals asked for, each probe once.
	stuck   map[uint64]bool
	removed map[*engine.Request]int
}

func (e *pathEngine) AddEach(sites []*splice.Site, sp engine.Spec) ([]*engine.Request, []error) {
	rs, errs := make([]*engine.Request, len(sites)), make([]error, len(sites))
	for i, s := range sites {
		if e.fail[s.Addr()] {
			errs[i] = fmt.Errorf("no room")
			continue
		}
		rs[i] = new(engine.Request)
		e.at[rs[i]] = s.Addr()
	}
	return rs, errs
}
func (e *pathEngine) RemoveEach(rs []*engine.Request) []error {
	errs := make([]error, len(rs))
	for i, r := range rs {
		if e.stuck[e.at[r]] {
			errs[i] = fmt.Errorf("busy")
			continue
		}
		if e.removed != nil {
			e.removed[r]++
		}
	}
	return errs
}
func (e *pathEngine) Hit(r *engine.Request) bool { return e.ran[e.at[r]] }

// covered plays the blocks of path (cfg indices) of fn's function under a
// Set, all blocks or not, and returns the covered block indices and the
// number of probes.
func covered(t *testing.T, name string, path []int, all bool) ([]int, snapshot) {
	f := pruneFunc(t, name)
	s := New("")
	if all {
		s.AllBlocks()
	}
	s.Add(f)
	e := &pathEngine{at: map[*engine.Request]uint64{}, ran: map[uint64]bool{}}
	now := time.Unix(0, 0)
	s.Arm(e, "test", Flag(nil), func() time.Time { return now })
	for _, b := range path {
		blk := &f.Blocks[b]
		for i := blk.First; i < blk.First+blk.N; i++ {
			e.ran[f.Fn.Insns[i].Addr] = true
		}
		s.Sweep(e, now) // a sweep between blocks: the inference holds at any instant
	}
	rep := snap(s, now)
	var got []int
	for _, b := range rep.Functions[0].Blocks {
		if b.Covered {
			got = append(got, b.Index)
		}
	}
	return got, rep
}

// Every path, whole and cut short, covers the same blocks pruned and
// unpruned; pruning saves probes.
func TestPrunedEqualsAllBlocks(t *testing.T) {
	for _, tc := range []struct {
		fn    string
		paths [][]int
		saved int
	}{
		{"diamond", [][]int{{0, 1, 3}, {0, 2, 3}, {0, 1}, {0, 2}}, 1},
		{"calls", [][]int{{0, 1, 3}, {0}}, 0},
		{"chain", [][]int{{0, 1, 2}, {0, 1, 4}, {0, 5}, {0, 1}, {0}}, 2},
		{"ifthen", [][]int{{0, 1, 2}, {0, 2}, {0, 1}, {0}}, 1},
		{"ifthen-sym", [][]int{{0, 1, 2}, {0, 2}, {2}}, 0},
		{"goto", [][]int{{0, 1}, {0, 2}, {0, 1, 2}, {2}}, 0},
	} {
		for _, path := range tc.paths {
			pruned, prep := covered(t, tc.fn, path, false)
			whole, wrep := covered(t, tc.fn, path, true)
			// A whole path (to a return) covers the same blocks. Cut short
			// (a task preempted in a block with no call), the pruned Set
			// never claims a block that did not run, and lags only in
			// inferred blocks, by the few instructions to a successor.
			if last := path[len(path)-1]; len(pruneFunc(t, tc.fn).Blocks[last].Succs) == 0 {
				if !slices.Equal(pruned, whole) {
					t.Errorf("%s path %v: pruned covers %v, all blocks %v", tc.fn, path, pruned, whole)
				}
			} else {
				for _, b := range pruned {
					if !slices.Contains(whole, b) {
						t.Errorf("%s path %v: pruned covers %d, which did not run (%v)", tc.fn, path, b, whole)
					}
				}
				for _, b := range whole {
					if !slices.Contains(pruned, b) && !prep.Functions[0].Blocks[slices.IndexFunc(prep.Functions[0].Blocks, func(x Block) bool { return x.Index == b })].Inferred {
						t.Errorf("%s path %v: pruned misses probed block %d", tc.fn, path, b)
					}
				}
			}
			if saved := wrep.Armed - prep.Armed; saved != tc.saved || prep.Inferred != tc.saved {
				t.Errorf("%s: %d probes saved, %d inferred; want %d", tc.fn, saved, prep.Inferred, tc.saved)
			}
		}
	}
}

// A successor whose probe cannot be armed takes back the inference: the
// block it was for is probed itself, and still reported right; the same
// when Arm hands the engine one probe, or two, at a time (its chunks
// write the armed probes back over the planned ones).
func TestInferenceFallsBack(t *testing.T) {
	for _, chunk := range []int{ArmChunk, 1, 2} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			defer func(n int) { ArmChunk = n }(ArmChunk)
			ArmChunk = chunk
			inferenceFallsBack(t)
		})
	}
}

func inferenceFallsBack(t *testing.T) {
	f := pruneFunc(t, "chain")
	s := New("")
	s.Add(f)
	// B5's probe fails: B0 (inferred from B1 and B5) needs its own; B1
	// (from B2 and B4) stays inferred.
	e := &pathEngine{at: map[*engine.Request]uint64{}, ran: map[uint64]bool{}, fail: map[uint64]bool{pruneBase + 0x0e: true}}
	now := time.Unix(0, 0)
	s.Arm(e, "test", Flag(nil), func() time.Time { return now })
	rep := snap(s, now)
	blocks := map[int]Block{}
	for _, b := range rep.Functions[0].Blocks {
		blocks[b.Index] = b
	}
	if rep.Inferred != 1 || !blocks[1].Inferred || blocks[0].Inferred || blocks[0].Point == "" || blocks[5].Refused == "" || rep.Armed != 3 {
		t.Fatalf("after B5 was refused: inferred %d, armed %d, blocks %+v", rep.Inferred, rep.Armed, blocks)
	}
	for _, a := range []uint64{0x00, 0x04, 0x08} { // B0, B1, B2
		e.ran[pruneBase+a] = true
	}
	s.Sweep(e, now)
	rep = snap(s, now)
	var got []int
	for _, b := range rep.Functions[0].Blocks {
		if b.Covered {
			got = append(got, b.Index)
		}
	}
	if !slices.Equal(got, []int{0, 1, 2}) || rep.CoveredInferred != 1 {
		t.Errorf("covered %v (%d inferred), want [0 1 2] (1)", got, rep.CoveredInferred)
	}
	if live := s.Live(); len(live) != 1 || live[0].Request == nil || e.at[live[0].Request] == 0 {
		t.Errorf("live after the sweep: %+v, want one probe (of 3 armed, 2 ran)", live)
	}
}

// Remove hands the engine its probes in chunks, as Arm does: every probe
// is asked for once, a probe that cannot be removed stays live with its
// error and the others go, whatever the chunk size.
func TestRemoveInChunks(t *testing.T) {
	for _, chunk := range []int{ArmChunk, 1, 2} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			defer func(n int) { ArmChunk = n }(ArmChunk)
			ArmChunk = chunk
			f := pruneFunc(t, "chain")
			s := New("")
			s.AllBlocks()
			s.Add(f)
			stuckAt := uint64(pruneBase + 0x04) // B1
			e := &pathEngine{at: map[*engine.Request]uint64{}, ran: map[uint64]bool{},
				stuck: map[uint64]bool{stuckAt: true}, removed: map[*engine.Request]int{}}
			now := time.Unix(0, 0)
			s.Arm(e, "test", Flag(nil), func() time.Time { return now })
			armed := len(s.Live())
			done, err := s.Remove(e)
			if done || err == nil {
				t.Fatalf("Remove: done %v, err %v; want not done and B1's error", done, err)
			}
			live := s.Live()
			if len(live) != 1 || e.at[live[0].Request] != stuckAt {
				t.Fatalf("live after Remove: %+v, want B1's probe alone", live)
			}
			if len(e.removed) != armed-1 {
				t.Errorf("%d probes removed, want %d", len(e.removed), armed-1)
			}
			for r, n := range e.removed {
				if n != 1 {
					t.Errorf("probe at %#x removed %d times", e.at[r], n)
				}
			}
			delete(e.stuck, stuckAt)
			if done, err := s.Remove(e); !done || err != nil || len(s.Live()) != 0 {
				t.Errorf("second Remove: done %v, err %v, %d live", done, err, len(s.Live()))
			}
		})
	}
}
