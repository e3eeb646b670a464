package engine

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine/enginetest"
	"github.com/kinst/kinst/internal/x86dec"
	"github.com/kinst/kinst/splice"
)

const textAddr = enginetest.TextAddr

var text = enginetest.Text

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

// harness is an engine over the fixture kernel and a planner over the
// engine's text view and springboard heap, as the daemon wires them.
type harness struct {
	t testing.TB
	e *Engine
	p *splice.Planner
	k *enginetest.Kernel
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	k, path, err := enginetest.Fixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	e := New(Config{Device: k, Log: discard})
	p, err := enginetest.Planner(e.Text(), e.Springboards(), path)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, e: e, p: p, k: k}
}

// count resolves every point, then adds a counting request at each for
// owner (as a session does).
func (h *harness) count(owner string, hooks Hooks, points ...string) []*Request {
	h.t.Helper()
	var sites []*splice.Site
	for _, pt := range points {
		s, err := h.p.Resolve(pt)
		if err != nil {
			h.t.Fatalf("%s: %v", pt, err)
		}
		sites = append(sites, s)
	}
	var out []*Request
	for _, s := range sites {
		r, err := h.e.Add(s, Spec{Owner: owner, Slots: 1, Snippet: CounterSnippet, Hooks: hooks})
		if err != nil {
			h.t.Fatalf("%s: %v", s.Point().Spec, err)
		}
		out = append(out, r)
	}
	return out
}

func (h *harness) remove(rs ...*Request) {
	h.t.Helper()
	for _, r := range rs {
		if err := h.e.Remove(r); err != nil {
			h.t.Fatal(err)
		}
	}
}

// restored checks that the text, the patch heap, the driver's splices and
// the engine's state are as before anything was installed (but for the
// covering finisher's counts, which its goroutine keeps).
func (h *harness) restored() {
	h.t.Helper()
	h.e.Reclaim()
	if st := h.e.State(); !bytes.Equal(h.k.TextNow(), text) || len(h.k.AllocsNow()) != 0 || len(h.k.Splices) != 0 ||
		st != (State{CoveringArmed: st.CoveringArmed, CoveringJumps: st.CoveringJumps}) {
		h.t.Errorf("not restored: text % x, allocations %v, splices %v, state %+v", h.k.TextNow(), h.k.AllocsNow(), h.k.Splices, st)
	}
}

// patchOf reads the patch of r's point.
func (h *harness) patchOf(r *Request) (uint64, []byte) {
	h.t.Helper()
	at := h.e.Installed(r).Patch
	code := make([]byte, h.k.AllocsNow()[at])
	if err := h.k.Read(at, code); err != nil {
		h.t.Fatal(err)
	}
	return at, code
}

// countIncs counts "lock incq" instructions of the patch's instrumentation
// and checks every one addresses a slot in use.
func (h *harness) countIncs(code []byte, at uint64) int {
	h.t.Helper()
	n := 0
	for off := 0; off+8 <= len(code); {
		if bytes.HasPrefix(code[off:], []byte{0xf0, 0x48, 0xff, 0x05}) {
			tgt := at + uint64(off) + 8 + uint64(int64(int32(uint32(code[off+4])|uint32(code[off+5])<<8|uint32(code[off+6])<<16|uint32(code[off+7])<<24)))
			found := false
			h.e.mu.Lock()
			for _, s := range h.e.slots.inUseSlots() {
				found = found || h.k.CounterAddr(s) == tgt
			}
			h.e.mu.Unlock()
			if !found {
				h.t.Errorf("lock incq at +%d addresses %#x, no slot in use", off, tgt)
			}
			n++
			off += 8
			continue
		}
		off++
	}
	return n
}

// TestDirectSplice: a 7-byte instruction takes a jmp rel32 to a verified
// counting patch; removal restores every byte and frees everything.
func TestDirectSplice(t *testing.T) {
	h := newHarness(t)
	r := h.count("a", nil, "lookuppn")[0]
	in := h.e.Installed(r)
	if in.Class.String() != "direct" || in.Requests != 1 || r.Site().Addr() != textAddr+0xb {
		t.Fatalf("installed %+v at %s", in, r.Site().Where())
	}
	now := h.k.TextNow()
	want, _ := codegen.JmpRel32(textAddr+0x0b, in.Patch)
	if !bytes.Equal(now[0x0b:0x10], want) || !bytes.Equal(now[0x10:], text[0x10:]) || !bytes.Equal(now[:0x0b], text[:0x0b]) {
		t.Fatalf("text % x, want jmp %x at +0xb and nothing else changed", now, want)
	}
	_, code := h.patchOf(r)
	for len(code) > 0 && code[len(code)-1] == 0xcc { // the heap's fill after the patch
		code = code[:len(code)-1]
	}
	if err := codegen.Verify(code, in.Patch, codegen.Site{Addr: textAddr + 0x0b, Bytes: text[0x0b:0x12]}, h.k.CounterAddr(r.Counter()), false); err != nil {
		t.Errorf("installed patch does not verify: %v", err)
	}
	h.remove(r)
	h.restored()
}

// TestSharedPatch: two owners at one point share one splice; each change
// builds a new patch and re-points the splice; the last removal restores
// the text.
func TestSharedPatch(t *testing.T) {
	h := newHarness(t)
	k := h.k
	a := h.count("a", nil, "lookuppn")
	b := h.count("b", nil, "filename_lookup+0xb", "filename_lookup+0xb")
	if k.SpliceCalls != 1 || k.Resplices != 2 || len(k.Splices) != 1 {
		t.Fatalf("splices %d, resplices %d, installed %d; want 1, 2, 1", k.SpliceCalls, k.Resplices, len(k.Splices))
	}
	h.e.Reclaim()
	if n := len(k.AllocsNow()); n != 1 {
		t.Errorf("%d patches allocated; replaced patches must be freed", n)
	}
	at, code := h.patchOf(b[0])
	if n := h.countIncs(code, at); n != 3 {
		t.Errorf("shared patch has %d counters, want 3", n)
	}
	if want, _ := codegen.JmpRel32(textAddr+0x0b, at); !bytes.Equal(k.TextNow()[0x0b:0x10], want) {
		t.Errorf("splice jumps %x, want %x (the newest patch)", k.TextNow()[0x0b:0x10], want)
	}
	h.remove(a...)
	h.e.Reclaim()
	if len(k.Splices) != 1 || k.Resplices != 3 {
		t.Fatalf("after removing one owner's: installed %d, resplices %d", len(k.Splices), k.Resplices)
	}
	at, code = h.patchOf(b[0])
	if n := h.countIncs(code, at); n != 2 {
		t.Errorf("patch after removal has %d counters, want 2", n)
	}
	h.remove(b...)
	h.restored()
	if err := h.e.Remove(b[0]); err == nil {
		t.Error("a request removed twice")
	}
}

// TestTrapSplice: a 1-byte instruction takes a trap splice: one int3, a
// patch with the counter and the relocated instruction.
func TestTrapSplice(t *testing.T) {
	h := newHarness(t)
	// next_fn is one ret: no slot, no run to cover.
	r := h.count("a", nil, "next_fn")[0]
	in := h.e.Installed(r)
	if in.Class.String() != "trap" || in.Springboard != 0 {
		t.Errorf("class %s (springboard %#x), want trap", in.Class, in.Springboard)
	}
	now := h.k.TextNow()
	if now[0x30] != 0xcc || !bytes.Equal(now[:0x30], text[:0x30]) {
		t.Errorf("text = % x, want one int3 at +0x30", now)
	}
	_, code := h.patchOf(r)
	site := codegen.Site{Addr: textAddr + 0x30, Bytes: text[0x30:0x31]}
	if err := codegen.Verify(code, in.Patch, site, h.k.CounterAddr(r.Counter()), r.Site().FlagsLive()); err != nil {
		t.Errorf("trap patch: %v", err)
	}
	h.remove(r)
	h.restored()
}

// TestSpringboardSplices: short instructions get slots in the padding
// after the function's last jmp (12 int3 bytes: two slots) while slots
// last; one planned with a slot free that finds none left when it is
// installed gets a trap splice; a second request at a springboard point
// re-points its slot; slots go back only after the patches are freed.
func TestSpringboardSplices(t *testing.T) {
	h := newHarness(t)
	k := h.k
	rs := h.count("a", nil, "filename_lookup+0x9", "filename_lookup+0x12", "filename_lookup+0x1c")
	want := []string{"springboard", "springboard", "trap"}
	now := k.TextNow()
	for i, r := range rs {
		in := h.e.Installed(r)
		if in.Class.String() != want[i] {
			t.Errorf("%s: class %s, want %s", r.Site().Where(), in.Class, want[i])
		}
		if in.Class.String() != "springboard" {
			continue
		}
		off, slot := r.Site().Addr()-textAddr, in.Springboard
		if slot < textAddr+0x24 || slot+5 > textAddr+0x30 {
			t.Errorf("%s: slot %#x outside the padding", r.Site().Where(), slot)
			continue
		}
		if now[off] != 0xeb || textAddr+off+2+uint64(int64(int8(now[off+1]))) != slot {
			t.Errorf("%s: text % x, want jmp rel8 to %#x", r.Site().Where(), now[off:off+2], slot)
		}
		so := slot - textAddr
		if jmp, _ := codegen.JmpRel32(slot, in.Patch); !bytes.Equal(now[so:so+5], jmp) {
			t.Errorf("%s: slot holds % x, want jmp to the patch %#x", r.Site().Where(), now[so:so+5], in.Patch)
		}
	}
	if n := h.e.State().Springboards; n != 2 {
		t.Errorf("%d slots in use, want 2", n)
	}
	before, first := k.Resplices, h.e.Installed(rs[0])
	r2 := h.count("b", nil, "filename_lookup+0x9")[0]
	in2 := h.e.Installed(r2)
	if k.Resplices != before+1 || in2.Springboard != first.Springboard {
		t.Errorf("resplices %d→%d, slot %#x (was %#x)", before, k.Resplices, in2.Springboard, first.Springboard)
	}
	so := in2.Springboard - textAddr
	if jmp, _ := codegen.JmpRel32(in2.Springboard, in2.Patch); !bytes.Equal(k.TextNow()[so:so+5], jmp) {
		t.Error("slot not re-pointed at the new patch")
	}
	if at, code := h.patchOf(r2); h.countIncs(code, at) != 2 {
		t.Errorf("shared springboard patch has %d counters, want 2", h.countIncs(code, at))
	}
	h.remove(append(rs, r2)...)
	if n := h.e.State().Springboards; n != 2 {
		t.Errorf("slots returned before the patches were freed (%d in use)", n)
	}
	h.restored()
}

// TestCoveringSplice: a 1-byte push takes a covering splice over the next
// two instructions (one jmp rel32 over push %rbp; mov %rsp,%rbp; push
// %r12's first byte); a request at a covered instruction joins the same
// patch, with its counter after the first instruction's copy; a point
// whose run would take an instruction another point holds gets a trap
// splice; removal restores every byte.
func TestCoveringSplice(t *testing.T) {
	h := newHarness(t)
	k := h.k
	a := h.count("a", nil, "filename_lookup+0x5")[0]
	ia := h.e.Installed(a)
	if ia.Class.String() != "covering" || k.Covering != 1 {
		t.Fatalf("class %s, %d covering splices", ia.Class, k.Covering)
	}
	now := k.TextNow()
	jmp, _ := codegen.JmpRel32(textAddr+5, ia.Patch)
	if !bytes.Equal(now[5:10], jmp) || !bytes.Equal(now[:5], text[:5]) || !bytes.Equal(now[10:], text[10:]) {
		t.Errorf("text % x, want jmp %x at +0x5 and nothing else changed", now, jmp)
	}
	b := h.count("b", nil, "filename_lookup+0x6")[0]
	ib := h.e.Installed(b)
	if ib.Class.String() != "covering" || b.Site().Insn().String() != "mov %rsp,%rbp" || ib.Site != a.Site() ||
		k.SpliceCalls != 1 || k.Resplices != 1 {
		t.Errorf("request at a covered instruction: %+v; %d splices, %d re-splices", ib, k.SpliceCalls, k.Resplices)
	}
	if st := h.e.State(); st.Splices != 1 || st.Points != 3 {
		t.Errorf("state %+v: want one splice over three instructions", st)
	}
	// The shared patch: counter, push %rbp, counter, mov, push %r12,
	// jmp back to +0xb.
	at, code := h.patchOf(b)
	var ops []string
	for off := 0; off < len(code); {
		inst, err := x86dec.Decode(code[off:])
		if err != nil {
			t.Fatalf("patch +%d: %v", off, err)
		}
		if inst.Op != x86asm.PUSHFQ && inst.Op != x86asm.POPFQ {
			ops = append(ops, inst.Op.String())
		}
		off += inst.Len
		if inst.Op == x86asm.JMP {
			if to := at + uint64(off) + uint64(int64(inst.Args[0].(x86asm.Rel))); to != textAddr+0xb {
				t.Errorf("patch jumps back to %#x, want %#x", to, uint64(textAddr+0xb))
			}
			break
		}
	}
	if got := strings.Join(ops, " "); got != "INC PUSH INC MOV PUSH JMP" {
		t.Errorf("patch %s", got)
	}
	h.remove(a, b)
	h.restored()

	// +0x6 first (a slot is in reach: a springboard splice); then +0x5's
	// run would take +0x6, so +0x5 gets a trap splice.
	c := h.count("c", nil, "filename_lookup+0x6", "filename_lookup+0x5")
	if c0, c1 := h.e.Installed(c[0]).Class.String(), h.e.Installed(c[1]).Class.String(); c0 != "springboard" || c1 != "trap" {
		t.Errorf("classes %s, %s; want springboard, trap", c0, c1)
	}
	if st := h.e.State(); st.Splices != 2 {
		t.Errorf("%d splices, want 2 (a covered instruction is not a splice)", st.Splices)
	}
	h.remove(c...)
	h.restored()
}

// stepLog records the steps a request's changes report.
type stepLog struct{ steps []Step }

func (l *stepLog) Step(s Step, d time.Duration) {
	if d < 0 {
		panic("negative duration")
	}
	l.steps = append(l.steps, s)
}

func (l *stepLog) String() string {
	var b []string
	for _, s := range l.steps {
		b = append(b, s.String())
	}
	return strings.Join(b, " ")
}

// TestHooks: each change reports the Figure 4 steps it took, in order,
// for every class; the free of a replaced patch is reported to the
// request whose change retired it, by the batched reclaim; requests
// without hooks cost nothing and see nothing.
func TestHooks(t *testing.T) {
	for _, tc := range []struct {
		point, add, resplice, remove string
	}{
		{"lookuppn", "patch_alloc codegen patch_write splice", "patch_alloc codegen patch_write resplice", "unsplice free"},
		{"filename_lookup+0x9", "patch_alloc codegen patch_write slot_find springboard splice",
			"patch_alloc codegen patch_write resplice", "unsplice free"},
		{"filename_lookup+0x5", "patch_alloc codegen patch_write splice", "patch_alloc codegen patch_write resplice", "unsplice free"},
		{"next_fn", "patch_alloc codegen patch_write splice", "patch_alloc codegen patch_write resplice", "unsplice free"},
	} {
		t.Run(tc.point, func(t *testing.T) {
			h := newHarness(t)
			var first, second stepLog
			r1 := h.count("a", &first, tc.point)[0]
			if got := first.String(); got != tc.add {
				t.Errorf("first request: %s, want %s", got, tc.add)
			}
			r2 := h.count("b", &second, tc.point)[0]
			h.e.Reclaim() // the first patch, retired by the second request
			if got, want := second.String(), tc.resplice+" free"; got != want {
				t.Errorf("second request: %s, want %s", got, want)
			}
			h.remove(r2)
			h.e.Reclaim()
			first.steps = nil
			h.remove(r1)
			h.e.Reclaim()
			if got := first.String(); got != tc.remove {
				t.Errorf("last removal: %s, want %s", got, tc.remove)
			}
			h.restored()
		})
	}
}

// TestFailedSpliceChangesNothing: a driver that refuses the splice leaves
// no patch, slot, counter or overlay entry behind.
func TestFailedSpliceChangesNothing(t *testing.T) {
	h := newHarness(t)
	h.k.FailSplice = true
	for _, pt := range []string{"lookuppn", "filename_lookup+0x9", "filename_lookup+0x5", "next_fn"} {
		s, err := h.p.Resolve(pt)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.e.Add(s, Spec{Owner: "a", Slots: 1, Snippet: CounterSnippet}); err == nil {
			t.Errorf("%s: injected failure not reported", pt)
		}
	}
	h.restored()
}

// TestReserveCounters: a reserved block is contiguous, zeroed and kept
// apart from requests' slots until released.
func TestReserveCounters(t *testing.T) {
	h := newHarness(t)
	r := h.count("a", nil, "lookuppn")[0]
	for i := range h.k.Counters {
		h.k.Counters[i] = 7
	}
	base, err := h.e.ReserveCounters(10)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Counter(); c >= base && c < base+10 {
		t.Errorf("block %d..%d holds the request's slot %d", base, base+9, c)
	}
	for i := base; i < base+10; i++ {
		if h.k.Counters[i] != 0 {
			t.Errorf("slot %d not zeroed", i)
		}
	}
	if _, err := h.e.ReserveCounters(len(h.k.Counters)); err == nil {
		t.Error("more slots than there are")
	}
	h.e.ReleaseCounters(base, 10)
	h.remove(r)
	h.restored()
}

// gatedFinish is a driver whose FinishCovering waits for a go-ahead, to
// see how the engine's finisher batches splices armed meanwhile.
type gatedFinish struct {
	*enginetest.Kernel
	calls chan struct{} // a FinishCovering started
	gate  chan int      // its answer: jmps written
}

func (g *gatedFinish) FinishCovering() (int, error) {
	g.calls <- struct{}{}
	return <-g.gate, nil
}

// TestCoverFinisher: the first armed splice starts one background
// FinishCovering; splices armed while it waits are served by exactly one
// more round; afterwards nothing is armed and the jmps are counted.
func TestCoverFinisher(t *testing.T) {
	k, _, err := enginetest.Fixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedFinish{Kernel: k, calls: make(chan struct{}), gate: make(chan int)}
	var c coverFinisher
	c.kick(g, discard, 1)
	<-g.calls             // round 1 waits for its grace period
	c.kick(g, discard, 1) // armed meanwhile: round 1 does not cover them
	c.kick(g, discard, 1)
	if armed, _ := c.state(); armed != 3 {
		t.Errorf("%d armed, want 3", armed)
	}
	g.gate <- 1
	select { // exactly one more round for both
	case <-g.calls:
	case <-time.After(5 * time.Second):
		t.Fatal("no second round for the splices armed during the first")
	}
	g.gate <- 2
	deadline := time.Now().Add(5 * time.Second)
	for {
		armed, jmps := c.state()
		c.mu.Lock()
		running := c.running
		c.mu.Unlock()
		if armed == 0 && !running {
			if jmps != 3 {
				t.Errorf("%d jmps counted, want 3", jmps)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("finisher did not settle: %d armed, running %v", armed, running)
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-g.calls:
		t.Error("a third round ran with nothing armed")
	case <-time.After(50 * time.Millisecond):
	}
}

func TestCheckClobbers(t *testing.T) {
	site := codegen.Site{Addr: textAddr + 0x0b, Bytes: text[0x0b:0x12]}
	flagsLive := cfg.FlagBits
	for _, save := range []bool{false, true} {
		code, err := codegen.CounterPatch(0xffffffffc0000000, site, 0xffffffffc0100000, save)
		if err != nil {
			t.Fatal(err)
		}
		err = checkClobbers(code[:codegen.CounterPrefixLen(save)], 0xffffffffc0000000, flagsLive)
		if save && err != nil {
			t.Errorf("flags saved: %v", err)
		}
		if !save && !errors.Is(err, ErrClobber) {
			t.Errorf("flags not saved where live: %v, want ErrClobber", err)
		}
	}
}

// TestTextView: the text view shows the original bytes under the
// engine's own splices (the driver's reads show the splice).
func TestTextView(t *testing.T) {
	h := newHarness(t)
	rs := h.count("a", nil, "filename_lookup+0xb", "filename_lookup+0x9", "next_fn")
	view := make([]byte, len(text))
	if err := h.e.Text().Read(textAddr, view); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(view, text) {
		t.Errorf("text view % x, want the original % x", view, text)
	}
	if bytes.Equal(h.k.TextNow(), text) {
		t.Error("the driver's read shows no splice")
	}
	if st := h.e.State(); st.Overlay != 4 { // three instructions and a slot
		t.Errorf("overlay holds %d ranges, want 4", st.Overlay)
	}
	h.remove(rs...)
	h.restored()
}

// TestSlotTakenBack: a springboard point removed and made again (from the
// same plan, as bench splice does) before the reclaim takes back its own
// slot (a task stopped on the slot's jmp came from that instruction); no
// other instruction gets the slot until the reclaim, and a slot taken
// back is not released early when the new splice fails.
func TestSlotTakenBack(t *testing.T) {
	h := newHarness(t)
	s, err := h.p.Resolve("filename_lookup+0x9")
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Owner: "a", Slots: 1, Snippet: CounterSnippet}
	r, err := h.e.Add(s, spec)
	if err != nil {
		t.Fatal(err)
	}
	slot := h.e.Installed(r).Springboard
	h.remove(r)
	if st := h.e.State(); st.Springboards != 1 || st.Retired != 1 {
		t.Fatalf("after removal: %+v, want the slot retired", st)
	}
	// Another instruction in reach gets the other slot, not this one.
	other := h.count("b", nil, "filename_lookup+0x12")[0]
	if s := h.e.Installed(other).Springboard; s == slot || s == 0 {
		t.Errorf("+0x12 got slot %#x (the retired one is %#x)", s, slot)
	}
	again, err := h.e.Add(s, spec)
	if err != nil {
		t.Fatal(err)
	}
	if in := h.e.Installed(again); in.Class.String() != "springboard" || in.Springboard != slot {
		t.Errorf("made again: %s at slot %#x, want springboard at %#x", in.Class, in.Springboard, slot)
	}
	h.remove(again)
	h.k.FailSplice = true
	if _, err := h.e.Add(s, spec); err == nil {
		t.Fatal("injected failure not reported")
	}
	h.k.FailSplice = false
	h.e.mu.Lock()
	retiredSlot := false
	for _, r := range h.e.retired {
		retiredSlot = retiredSlot || r.slot == slot
	}
	h.e.mu.Unlock()
	if !retiredSlot {
		t.Error("a slot taken back from reclaim was released at once after a failed splice")
	}
	h.remove(other)
	h.restored()
}

// A request keeps the site as it resolved it (its own Point spec) when
// another request made the point, and its owner; a coverage probe's or a
// counter's record stays at 48 bytes (a whole-kernel session has half a
// million).
func TestRequestKeepsItsSite(t *testing.T) {
	h := newHarness(t)
	s1, err := h.p.Resolve("filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	s2, err := h.p.Resolve("lookuppn")
	if err != nil {
		t.Fatal(err)
	}
	if s1 == s2 || s1.Addr() != s2.Addr() {
		t.Fatalf("want two resolutions of one instruction: %p %p %#x %#x", s1, s2, s1.Addr(), s2.Addr())
	}
	r1, err := h.e.Add(s1, Spec{Owner: "one", Slots: 1, Snippet: CounterSnippet})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := h.e.Add(s2, Spec{Owner: "two", Slots: 1, Snippet: CounterSnippet})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Site() != s1 || r2.Site() != s2 || r2.Site().Point().Spec != "lookuppn" {
		t.Errorf("sites: %p %p, want %p %p", r1.Site(), r2.Site(), s1, s2)
	}
	if r1.Owner() != "one" || r2.Owner() != "two" {
		t.Errorf("owners %q %q", r1.Owner(), r2.Owner())
	}
	if n := unsafe.Sizeof(Request{}); n > 48 {
		t.Errorf("a Request takes %d bytes, want 48 at most", n)
	}
	for _, r := range []*Request{r2, r1} {
		if err := h.e.Remove(r); err != nil {
			t.Fatal(err)
		}
	}
}
