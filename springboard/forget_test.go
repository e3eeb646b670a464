package springboard

import "testing"

// Runs of text that went are no longer handed out, and the functions
// there can add their runs again (a module loaded at the same place).
func TestForget(t *testing.T) {
	h := NewHeap()
	const base = 0x1000
	h.AddFunction(base, func() []Range { return []Range{{base + 0x40, base + 0x50}} })
	h.AddFunction(base+0x100, func() []Range { return []Range{{base + 0x140, base + 0x150}} })
	if _, ok := h.Find(base + 0x30); !ok {
		t.Fatal("no slot before Forget")
	}
	h.Forget(base, base+0x100)
	if s, ok := h.Find(base + 0x30); ok {
		t.Errorf("slot %#x handed out in forgotten text", s)
	}
	if got := h.Runs(); len(got) != 1 || got[0].Start != base+0x140 {
		t.Errorf("runs after Forget: %v", got)
	}
	if h.Seen(base) {
		t.Error("a function of forgotten text still counts as seen")
	}
	if !h.Seen(base + 0x100) {
		t.Error("a function outside the forgotten text was forgotten")
	}
}
