package springboard

import (
	"errors"
	"testing"
	"time"
)

const base = 0xffffffff81000000

func TestJmpRel8Reach(t *testing.T) {
	lo, hi := Reach(base)
	for _, to := range []uint64{lo, hi, base + 2} {
		b, err := JmpRel8(base, to)
		if err != nil {
			t.Fatalf("%#x: %v", to, err)
		}
		if got := base + 2 + uint64(int64(int8(b[1]))); b[0] != 0xeb || got != to {
			t.Errorf("jmp rel8 % x lands on %#x, want %#x", b, got, to)
		}
	}
	for _, to := range []uint64{lo - 1, hi + 1} {
		if _, err := JmpRel8(base, to); err == nil {
			t.Errorf("%#x: out of reach accepted", to)
		}
	}
}

func TestHeapAllocWithinReach(t *testing.T) {
	h := NewHeap()
	h.Add(Range{base + 0x100, base + 0x10c}, // 12 bytes: two slots
		Range{base + 0x300, base + 0x303}) // too short
	insn := uint64(base + 0x90) // reach [0x12, 0x111]
	var got []uint64
	for {
		s, err := h.Alloc(insn)
		if errors.Is(err, ErrNoSlot) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		lo, hi := Reach(insn)
		if s < lo || s > hi || s < base+0x100 || s+SlotLen > base+0x10c {
			t.Fatalf("slot %#x outside reach or run", s)
		}
		got = append(got, s)
	}
	if len(got) != 2 || got[0] != base+0x100 || got[1] != base+0x105 {
		t.Fatalf("slots %#x, want 0x100 and 0x105 of the run", got)
	}
	// Out of reach entirely.
	if _, err := h.Alloc(base + 0x400); !errors.Is(err, ErrNoSlot) {
		t.Errorf("far instruction: %v", err)
	}
	// Released slots come back.
	h.Release(got[0])
	if s, err := h.Alloc(insn); err != nil || s != got[0] {
		t.Errorf("after release: %#x %v", s, err)
	}
	// Slot must start within reach: an instruction just past reach of
	// the last slot start gets nothing.
	h2 := NewHeap()
	h2.Add(Range{base, base + 5})
	if _, ok := h2.Find(base + 128 - 2 + 1); ok {
		t.Error("slot 129 bytes back accepted")
	}
	if _, ok := h2.Find(base + 128 - 2); !ok {
		t.Error("slot exactly 128 back (rel8 -128) refused")
	}
}

func TestCensus(t *testing.T) {
	runs := []Range{{base + 0x100, base + 0x10a}, {base + 0x1000, base + 0x1003}}
	shorts := []uint64{base + 0x80, base + 0x90, base + 0xa0, base + 0x800}
	// +0x90 and +0x800 can be covered; +0x800 has no slot in reach.
	c := TakeCensus(runs, shorts, []uint64{base + 0x90, base + 0x800})
	want := Census{Runs: 1, Bytes: 10, Slots: 2, Short: 4, InReach: 3, Assigned: 2, Trap: 1, Covering: 2, TrapOnly: 0}
	if c != want {
		t.Errorf("census %+v, want %+v", c, want)
	}
	c = TakeCensus(runs, shorts, nil)
	want = Census{Runs: 1, Bytes: 10, Slots: 2, Short: 4, InReach: 3, Assigned: 2, Trap: 1, Covering: 0, TrapOnly: 1}
	if c != want {
		t.Errorf("census %+v, want %+v", c, want)
	}
}

// TestHeapReserve: padding a covering splice's jmp takes is free only
// where no slot in use overlaps it, and once taken no slot is handed out
// over it; the run's bytes on either side stay slots.
func TestHeapReserve(t *testing.T) {
	h := NewHeap()
	h.Add(Range{0x1000, 0x1010}) // 16 bytes: three slots
	if !h.Reserve(Range{0x1004, 0x1008}, false) {
		t.Fatal("free padding reported in use")
	}
	if got := h.Runs(); len(got) != 1 {
		t.Fatalf("a question took bytes: %v", got)
	}
	s, err := h.Alloc(0x1000)
	if err != nil || s != 0x1000 {
		t.Fatalf("alloc: %#x, %v", s, err)
	}
	if h.Reserve(Range{0x1004, 0x1008}, true) {
		t.Fatal("padding under the slot at 0x1000 (to 0x1005) reported free")
	}
	if !h.Reserve(Range{0x1005, 0x1008}, true) {
		t.Fatal("padding clear of the slot reported in use")
	}
	want := []Range{{0x1000, 0x1005}, {0x1008, 0x1010}}
	if got := h.Runs(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("runs after the take: %v, want %v", got, want)
	}
	for i := 0; i < 2; i++ {
		s, err := h.Alloc(0x1000)
		if err == nil && s < 0x1008 && s+SlotLen > 0x1005 {
			t.Fatalf("slot %#x handed out over the taken bytes", s)
		}
		if i == 0 && (err != nil || s != 0x1008) {
			t.Fatalf("the run after the take: %#x, %v; want 0x1008", s, err)
		}
		if i == 1 && err == nil {
			t.Fatalf("a third slot at %#x: the runs hold two", s)
		}
	}
}

// TestHeapAddFunctionWaits: a planner that asks for a function's space
// while another goroutine is adding it waits for the add, and then
// finds the runs (it used to find the function seen and the runs not
// yet there, and reserved padding a slot was later handed out in); the
// space is computed once.
func TestHeapAddFunctionWaits(t *testing.T) {
	h := NewHeap()
	entered, release := make(chan struct{}), make(chan struct{})
	go h.AddFunction(0x1000, func() []Range {
		close(entered)
		<-release
		return []Range{{0x1010, 0x1020}}
	})
	<-entered
	found := make(chan bool)
	go func() {
		h.AddFunction(0x1000, func() []Range {
			t.Error("the space was computed twice")
			return nil
		})
		_, ok := h.Find(0x1000)
		found <- ok
	}()
	select {
	case <-found:
		t.Fatal("a second AddFunction returned while the first was still adding")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if !<-found {
		t.Fatal("after AddFunction the function's runs are not in the heap")
	}
	if h.AddFunction(0x1000, func() []Range { t.Error("computed again"); return nil }); len(h.Runs()) != 1 {
		t.Fatalf("runs: %v", h.Runs())
	}
}
