package kerninstd

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/arch/x86/x86asm"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
)

// TestBenchChurn: every change of every cycle is counted by kind, a
// session's request at a pool point survives the churn (its point is only
// ever re-spliced), and afterwards the text, the slots and the patch heap
// are as they were apart from that session.
func TestBenchChurn(t *testing.T) {
	d, k := newTestDaemon(t)
	before := textNow(t, k)
	steady, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0xb"}})
	if err != nil {
		t.Fatal(err)
	}
	withSteady := textNow(t, k)
	res, err := d.BenchChurn(context.Background(), api.ChurnRequest{Functions: []string{"filename_lookup"}, Points: []string{"lookuppn"}, Cycles: 40, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 40 || !res.Restored || res.Pool < 5 {
		t.Fatalf("churn = %+v", res)
	}
	if n := res.Splice.N + res.Resplice.N + res.Unsplice.N; n != 12*40 || res.Splice.N != res.Unsplice.N || res.Resplice.N == 0 {
		t.Errorf("changes: %d splices, %d re-splices, %d unsplices", res.Splice.N, res.Resplice.N, res.Unsplice.N)
	}
	if k.spliceCalls == 0 || k.resplices == 0 {
		t.Errorf("driver saw %d splices and %d re-splices", k.spliceCalls, k.resplices)
	}
	// The session's splice was re-pointed by the churn: it must lead to
	// the point's current patch; every other byte is as before.
	got := textNow(t, k)
	if pt := d.points[textAddr+0xb]; pt == nil {
		t.Fatal("the session's point is gone")
	} else if jmp, _ := codegen.JmpRel32(textAddr+0xb, pt.patch); !bytes.Equal(got[0xb:0x10], jmp) {
		t.Errorf("session splice %x, want %x", got[0xb:0x10], jmp)
	}
	if !bytes.Equal(got[:0xb], withSteady[:0xb]) || !bytes.Equal(got[0x10:], withSteady[0x10:]) {
		t.Errorf("after churn:\n%x\nwant (the session's splice only)\n%x", got, withSteady)
	}
	if len(d.points) != 1 || len(k.splices) != 1 {
		t.Errorf("%d points, %d driver splices left; want the session's one", len(d.points), len(k.splices))
	}
	if _, err := d.RemoveSession(steady.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), before) || len(k.allocs) != 0 || d.spring.InUse() != 0 || len(d.ov.orig) != 0 {
		t.Errorf("left behind: patches %v, %d slots, overlay %v", k.allocs, d.spring.InUse(), d.ov.orig)
	}
}

// TestBenchChurnBadRequests: a bad pool is refused before anything is
// spliced.
func TestBenchChurnBadRequests(t *testing.T) {
	d, k := newTestDaemon(t)
	before := textNow(t, k)
	for _, tc := range []struct {
		req  api.ChurnRequest
		want error
	}{
		{api.ChurnRequest{Points: []string{"lookuppn"}}, nil},
		{api.ChurnRequest{Cycles: 5}, nil},
		{api.ChurnRequest{Points: []string{"lookuppn", "nosuch"}, Cycles: 5}, kernel.ErrUnknownFunction},
		{api.ChurnRequest{Functions: []string{"nosuch"}, Cycles: 5}, kernel.ErrUnknownFunction},
		{api.ChurnRequest{Points: []string{"filename_lookup+0x1"}, Cycles: 5}, nil}, // mid-instruction
	} {
		_, err := d.BenchChurn(context.Background(), tc.req)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%+v: err %v, want %v", tc.req, err, tc.want)
		}
	}
	if !bytes.Equal(textNow(t, k), before) || k.spliceCalls != 0 || len(k.allocs) != 0 {
		t.Errorf("refused requests changed something: %d splices, allocations %v", k.spliceCalls, k.allocs)
	}
}

// TestCoveringSplice: a 1-byte push takes a covering splice over the next
// two instructions (one jmp rel32 over push %rbp; mov %rsp,%rbp; push
// %r12's first byte); a request at a covered instruction joins the same
// patch, with its counter after the first instruction's copy; a point
// whose run would take an instruction another point holds gets a trap
// splice; removal restores every byte.
func TestCoveringSplice(t *testing.T) {
	d, k := newTestDaemon(t)
	a, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x5"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := a.Probes[0]; p.SpliceClass != "covering" || k.covering != 1 {
		t.Fatalf("class %s, %d covering splices", p.SpliceClass, k.covering)
	}
	now := textNow(t, k)
	jmp, _ := codegen.JmpRel32(textAddr+5, uint64(a.Probes[0].Patch))
	if !bytes.Equal(now[5:10], jmp) || !bytes.Equal(now[:5], text[:5]) || !bytes.Equal(now[10:], text[10:]) {
		t.Errorf("text % x, want jmp %x at +0x5 and nothing else changed", now, jmp)
	}
	b, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x6"}})
	if err != nil {
		t.Fatal(err)
	}
	pb := b.Probes[0]
	if pb.SpliceClass != "covering" || pb.Instruction != "mov %rsp,%rbp" || k.spliceCalls != 1 || k.resplices != 1 {
		t.Errorf("request at a covered instruction: %+v; %d splices, %d re-splices", pb, k.spliceCalls, k.resplices)
	}
	// The shared patch: counter, push %rbp, counter, mov, push %r12,
	// jmp back to +0xb.
	code := patchAt(t, k, pb)
	var ops []string
	for off := 0; off < len(code); {
		inst, err := x86asm.Decode(code[off:], 64)
		if err != nil {
			t.Fatalf("patch +%d: %v", off, err)
		}
		if inst.Op != x86asm.PUSHFQ && inst.Op != x86asm.POPFQ {
			ops = append(ops, inst.Op.String())
		}
		off += inst.Len
		if inst.Op == x86asm.JMP {
			if to := uint64(pb.Patch) + uint64(off) + uint64(int64(inst.Args[0].(x86asm.Rel))); to != textAddr+0xb {
				t.Errorf("patch jumps back to %#x, want %#x", to, uint64(textAddr+0xb))
			}
			break
		}
	}
	if got := strings.Join(ops, " "); got != "INC PUSH INC MOV PUSH JMP" {
		t.Errorf("patch %s", got)
	}
	for _, id := range []string{a.ID, b.ID} {
		if _, err := d.RemoveSession(id); err != nil {
			t.Fatal(err)
		}
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || len(d.points) != 0 || len(k.allocs) != 0 {
		t.Fatalf("not restored: points %d, allocations %v", len(d.points), k.allocs)
	}

	// +0x6 first (a slot is in reach: a springboard splice); then +0x5's
	// run would take +0x6, so +0x5 gets a trap splice.
	c, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x6", "filename_lookup+0x5"}})
	if err != nil {
		t.Fatal(err)
	}
	if c.Probes[0].SpliceClass != "springboard" || c.Probes[1].SpliceClass != "trap" {
		t.Errorf("classes %s, %s; want springboard, trap", c.Probes[0].SpliceClass, c.Probes[1].SpliceClass)
	}
	if info := d.Info(); info.Splices != 2 {
		t.Errorf("Info.Splices %d, want 2 (a covered instruction is not a splice)", info.Splices)
	}
	if _, err := d.RemoveSession(c.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) {
		t.Error("not restored")
	}
}

// gatedFinish is a driver whose FinishCovering waits for a go-ahead, to
// see how the daemon's finisher batches splices armed meanwhile.
type gatedFinish struct {
	*fakeKernel
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
	d, k := newTestDaemon(t)
	g := &gatedFinish{fakeKernel: k, calls: make(chan struct{}), gate: make(chan int)}
	d.dev = g
	c := &d.cover
	c.kick(d)
	<-g.calls // round 1 waits for its grace period
	c.kick(d) // armed meanwhile: round 1 does not cover them
	c.kick(d)
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

func TestInPadding(t *testing.T) {
	blocks := []cfg.Block{{First: 0, N: 2}, {First: 2, N: 3, Padding: true}, {First: 5, N: 1}}
	for i, want := range []bool{false, false, true, true, true, false, false} {
		if got := inPadding(blocks, i); got != want {
			t.Errorf("instruction %d: in padding %v, want %v", i, got, want)
		}
	}
}
