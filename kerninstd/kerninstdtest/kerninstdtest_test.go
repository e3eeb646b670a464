package kerninstdtest

import (
	"context"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
)

// The test kernel analyses as its comments say: entries after the
// prologue, exits at the return-thunk jumps, calls named.
func TestKernelShape(t *testing.T) {
	s := New(t)
	ctx := context.Background()
	g, err := s.Client.CFG(ctx, "do_sys_openat2")
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, b := range g.Blocks {
		for _, in := range b.Instructions {
			if in.Target != "" {
				targets = append(targets, in.Target)
			}
		}
	}
	if want := []string{"do_filp_open+0x0", "putname+0x0", "__x86_return_thunk+0x0"}; !equal(targets, want) {
		t.Errorf("do_sys_openat2 reaches %v, want %v", targets, want)
	}
	sess, err := s.Client.CreateSession(ctx, api.SessionRequest{Points: []string{"lookuppn"}, Timers: []string{"do_sys_openat2"}})
	if err != nil {
		t.Fatal(err)
	}
	if p := sess.Probes[0]; uint64(p.Address) != Addr("filename_lookup", 0xb) || p.SpliceClass != "direct" {
		t.Errorf("lookuppn at %#x (%s), want filename_lookup+0xb, direct", uint64(p.Address), p.SpliceClass)
	}
	tm := sess.Timers[0]
	if uint64(tm.Entry.Address) != Addr("do_sys_openat2", 9) || len(tm.Exits) != 1 || uint64(tm.Exits[0].Address) != Addr("do_sys_openat2", 0x1b) {
		t.Errorf("timer entry %s, exits %v; want +0x9 and +0x1b", tm.Entry.Point, tm.Exits)
	}
}

// Count and Time change what the daemon reports, through the patches it
// installed.
func TestCountAndTime(t *testing.T) {
	s := New(t)
	ctx := context.Background()
	sess, err := s.Client.CreateSession(ctx, api.SessionRequest{Points: []string{"lookuppn"}, Timers: []string{"do_sys_openat2"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Kernel.Count(Addr("filename_lookup", 0xb), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Kernel.Time(Addr("do_sys_openat2", 9), 3, 4500); err != nil {
		t.Fatal(err)
	}
	if err := s.Kernel.Count(Addr("putname", 9), 1); err == nil {
		t.Error("Count where nothing is spliced succeeded")
	}
	s.Clock.Advance(time.Second)
	final, err := s.Client.RemoveSession(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	tm := final.Timers[0]
	if final.Probes[0].Count != 7 || tm.Calls != 3 || tm.WallNS != 4500 || tm.Inside != 0 || !tm.Time.Equal(Epoch.Add(time.Second)) {
		t.Errorf("count %d, timer %+v; want 7, and 3 calls, 4500 ns at Epoch+1s", final.Probes[0].Count, tm.Totals)
	}
}

func TestClock(t *testing.T) {
	c := NewClock()
	tick, stop := c.NewTicker(time.Second)
	defer stop()
	after := c.After(1500 * time.Millisecond)
	c.AwaitTickers(1)
	if d := c.AwaitTimer(); d != 1500*time.Millisecond {
		t.Errorf("AwaitTimer = %v", d)
	}
	c.Advance(time.Second)
	if got := <-tick; !got.Equal(Epoch.Add(time.Second)) {
		t.Errorf("tick at %v", got)
	}
	select {
	case <-after:
		t.Fatal("After fired early")
	default:
	}
	c.Advance(time.Second)
	if got := <-after; !got.Equal(Epoch.Add(1500 * time.Millisecond)) {
		t.Errorf("After fired at %v", got)
	}
	if got := <-tick; !got.Equal(Epoch.Add(2 * time.Second)) {
		t.Errorf("second tick at %v", got)
	}
	if c.Nanos(42) != 42 || !c.Now().Equal(Epoch.Add(2*time.Second)) {
		t.Error("Nanos or Now")
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
