package kerninstd

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/kerninstd/bench"
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
	res, err := bench.Churn(context.Background(), benchKernel(d), api.ChurnRequest{Functions: []string{"filename_lookup"}, Points: []string{"lookuppn"}, Cycles: 40, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 40 || !res.Restored || res.Pool < 5 {
		t.Fatalf("churn = %+v", res)
	}
	if n := res.Splice.N + res.Resplice.N + res.Unsplice.N; n != 12*40 || res.Splice.N != res.Unsplice.N || res.Resplice.N == 0 {
		t.Errorf("changes: %d splices, %d re-splices, %d unsplices", res.Splice.N, res.Resplice.N, res.Unsplice.N)
	}
	if k.SpliceCalls == 0 || k.Resplices == 0 {
		t.Errorf("driver saw %d splices and %d re-splices", k.SpliceCalls, k.Resplices)
	}
	// The session's splice was re-pointed by the churn: it must lead to
	// the point's current patch; every other byte is as before.
	got := textNow(t, k)
	if ss := d.Sessions(); len(ss) != 1 || len(ss[0].Probes) != 1 {
		t.Fatal("the session's point is gone")
	} else if jmp, _ := codegen.JmpRel32(textAddr+0xb, uint64(ss[0].Probes[0].Patch)); !bytes.Equal(got[0xb:0x10], jmp) {
		t.Errorf("session splice %x, want %x", got[0xb:0x10], jmp)
	}
	if !bytes.Equal(got[:0xb], withSteady[:0xb]) || !bytes.Equal(got[0x10:], withSteady[0x10:]) {
		t.Errorf("after churn:\n%x\nwant (the session's splice only)\n%x", got, withSteady)
	}
	if d.eng.State().Points != 1 || len(k.Splices) != 1 {
		t.Errorf("%d points, %d driver splices left; want the session's one", d.eng.State().Points, len(k.Splices))
	}
	if _, err := d.RemoveSession(steady.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), before) || len(k.Allocs) != 0 || d.eng.State().Springboards != 0 || d.eng.State().Overlay != 0 {
		t.Errorf("left behind: patches %v, state %+v", k.AllocsNow(), d.eng.State())
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
		_, err := bench.Churn(context.Background(), benchKernel(d), tc.req)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%+v: err %v, want %v", tc.req, err, tc.want)
		}
	}
	if !bytes.Equal(textNow(t, k), before) || k.SpliceCalls != 0 || len(k.Allocs) != 0 {
		t.Errorf("refused requests changed something: %d splices, allocations %v", k.SpliceCalls, k.Allocs)
	}
}
