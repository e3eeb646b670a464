package kerninstd

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/engine/enginetest"
	"github.com/kinst/kinst/kernel"
)

func TestTimedSessionLifecycle(t *testing.T) {
	d, k := newTestDaemon(t)
	d.tm.loadTask = func(*kernel.Symbols) (kernel.TaskLayout, error) {
		return kernel.TaskLayout{CurrentTask: 0x1fb80, PID: 0x5c8, TGID: 0x5cc, Comm: 0x7c0}, nil
	}
	s, err := d.CreateSession(api.SessionRequest{Name: "incident", Timers: []string{"filename_lookup"}, Filter: &api.Filter{PID: 4242}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "incident" || len(s.Timers) != 1 {
		t.Fatalf("session %+v", s)
	}
	ti := s.Timers[0]
	if ti.Entry.Offset != 0x0b || len(ti.Exits) != 1 || ti.Exits[0].Offset != 0x1f || ti.Filter != "pid 4242" {
		t.Fatalf("timer entry %+v exits %+v filter %q; want +0xb, one exit at +0x1f, pid 4242", ti.Entry, ti.Exits, ti.Filter)
	}
	now := textNow(t, k)
	if now[0x0b] != 0xe9 || now[0x1f] != 0xe9 || !bytes.Equal(now[0x10:0x1f], text[0x10:0x1f]) {
		t.Fatalf("text %x: want jmps at +0xb and +0x1f and nothing else changed", now)
	}
	// The entry patch compares current->tgid (at 0x5cc) with 4242 and
	// reads the TSC; the exit patch has the cmpxchg loop.
	entry := patchBytes(t, k, textAddr+0x0b)
	if !bytes.Contains(entry, []byte{0xcc, 0x05, 0, 0, 0x92, 0x10, 0, 0}) || !bytes.Contains(entry, []byte{0x0f, 0x31}) {
		t.Errorf("entry patch %x lacks the tgid compare or rdtsc", entry)
	}
	if exit := patchBytes(t, k, textAddr+0x1f); !bytes.Contains(exit, []byte{0xf0, 0x48, 0x0f, 0xb1}) {
		t.Errorf("exit patch %x lacks lock cmpxchg", exit)
	}
	// Two calls that took 3,000,000 ticks in all, nobody inside now.
	slots := d.sessions[s.ID].timers[0].reqs[0].Slots()
	calls, word := slots[0], slots[1]
	k.Counters[calls] = 2
	k.Counters[word] = 3_000_000 << 16
	if _, err := d.CreateSession(api.SessionRequest{Name: "incident", Points: []string{"lookuppn"}}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("second session with the same name: %v", err)
	}
	list := d.Sessions()
	if len(list) != 1 || len(list[0].Timers) != 1 {
		t.Fatalf("sessions %+v", list)
	}
	pt := list[0].Timers[0].Totals
	want := d.clock.Nanos(3_000_000)
	if pt.Calls != 2 || pt.Inside != 0 || math.Abs(pt.WallNS-want) > want*1e-6 {
		t.Fatalf("point %+v, want 2 calls, 0 inside, %.0f ns", pt, want)
	}

	// Prometheus exposition, parsed by Prometheus's own parser.
	rec := httptest.NewRecorder()
	d.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(rec.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	got := fams["kinst_function_calls_total"]
	if got == nil || len(got.Metric) != 1 || got.Metric[0].GetCounter().GetValue() != 2 {
		t.Fatalf("kinst_function_calls_total = %v", got)
	}
	labels := map[string]string{}
	for _, l := range got.Metric[0].Label {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["session"] != "incident" || labels["function"] != "filename_lookup" || labels["filter"] != "pid 4242" {
		t.Errorf("labels %v", labels)
	}
	if w := fams["kinst_function_wall_seconds_total"]; w == nil || math.Abs(w.Metric[0].GetCounter().GetValue()-want/1e9) > want*1e-9*1e-3 {
		t.Errorf("wall seconds %v, want %g", w, want/1e9)
	}
	if fams["kinst_function_threads_inside"] == nil {
		t.Error("no threads-inside gauge")
	}

	final, err := d.RemoveSession("incident") // by name
	if err != nil {
		t.Fatal(err)
	}
	if final.Timers[0].Calls != 2 {
		t.Errorf("final %+v", final.Timers[0])
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || len(k.Allocs) != 0 || len(k.Splices) != 0 || d.eng.State().Counters != 0 {
		t.Errorf("not restored: allocs %v splices %v state %+v", k.AllocsNow(), k.Splices, d.eng.State())
	}
}

// patchBytes reads the patch the jmp at addr leads to.
func patchBytes(t *testing.T, k *enginetest.Kernel, addr uint64) []byte {
	t.Helper()
	var j [5]byte
	if err := k.Read(addr, j[:]); err != nil || j[0] != 0xe9 {
		t.Fatalf("no jmp at %#x", addr)
	}
	to := addr + 5 + uint64(int64(int32(uint32(j[1])|uint32(j[2])<<8|uint32(j[3])<<16|uint32(j[4])<<24)))
	b := make([]byte, k.Allocs[to])
	if err := k.Read(to, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSessionTTL(t *testing.T) {
	d, k := newTestDaemon(t)
	s, err := d.CreateSession(api.SessionRequest{Name: "forgotten", Timers: []string{"filename_lookup"}, TTLNS: int64(50 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if s.Expires == nil || s.Expires.Sub(s.Created) != 50*time.Millisecond {
		t.Fatalf("expires %v", s.Expires)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(d.Sessions()) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("session outlived its TTL")
		}
		time.Sleep(10 * time.Millisecond)
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || len(k.Splices) != 0 || len(k.Allocs) != 0 {
		t.Error("text not restored after the TTL")
	}
	if _, err := d.RemoveSession("forgotten"); !errors.Is(err, ErrNoSession) {
		t.Errorf("remove after expiry: %v", err)
	}
}

func TestTimedRefusals(t *testing.T) {
	d, k := newTestDaemon(t)
	d.tm.loadTask = func(*kernel.Symbols) (kernel.TaskLayout, error) { return kernel.TaskLayout{}, errors.New("no BTF") }
	for _, req := range []api.SessionRequest{
		{Timers: []string{"filename_lookup+0xb"}},
		{Timers: []string{"filename_lookup:1"}}, // a block: it timed nothing, said 0 calls
		{Timers: []string{"no_such_function"}},
		{Timers: []string{"filename_lookup", "lookuppn"}},
		{Timers: []string{"filename_lookup"}, Filter: &api.Filter{PID: 1, Comm: "x"}},
		{Timers: []string{"filename_lookup"}, Filter: &api.Filter{Comm: "a-name-longer-than-15"}},
		{Timers: []string{"filename_lookup"}, Filter: &api.Filter{PID: 1}}, // no task layout
		{Points: []string{"lookuppn"}, Filter: &api.Filter{PID: 1}},
		{Timers: []string{"filename_lookup"}, TTLNS: -1},
		{},
	} {
		if _, err := d.CreateSession(req); err == nil {
			t.Errorf("%+v accepted", req)
		}
		if !bytes.Equal(textNow(t, k), text) || len(k.Allocs) != 0 || d.eng.State().Counters != 0 {
			t.Fatalf("%+v changed something", req)
		}
	}
}

// A timer shares its entry point with a counter of another session.
func TestTimerSharesPointWithCounter(t *testing.T) {
	d, k := newTestDaemon(t)
	c, err := d.CreateSession(api.SessionRequest{Points: []string{"lookuppn"}})
	if err != nil {
		t.Fatal(err)
	}
	tm, err := d.CreateSession(api.SessionRequest{Timers: []string{"filename_lookup"}})
	if err != nil {
		t.Fatalf("timer at a counted point: %v", err)
	}
	if tm.Timers[0].Entry.Address != c.Probes[0].Address {
		t.Fatalf("entry %v, counter at %v: want the same instruction", tm.Timers[0].Entry.Address, c.Probes[0].Address)
	}
	if _, err := d.RemoveSession(tm.ID); err != nil {
		t.Fatal(err)
	}
	if textNow(t, k)[0x0b] != 0xe9 || textNow(t, k)[0x1f] != text[0x1f] {
		t.Fatal("removing the timer removed the counter's splice, or left its exit")
	}
	if _, err := d.RemoveSession(c.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || len(k.Allocs) != 0 {
		t.Fatal("not restored")
	}
}

// BenchmarkSample1000 is one pass of the sampling loop over 1,000 active
// timed functions (calls, timer word, and an off-CPU word each: three
// loads from the counter heap, a TSC read and the conversions). The
// reported cpu_%_at_10Hz is the share of one CPU the loop takes at ten
// passes a second.
func BenchmarkSample1000(b *testing.B) {
	d, k := newTestDaemon(b)
	const n = 1000
	k.Counters = make([]uint64, 3*n)
	timers := make([]*timedFunc, n)
	for i := range timers {
		timers[i] = &timedFunc{calls: 3 * i, word: 3*i + 1, virtual: &virtualState{off: 3*i + 2}}
		k.Counters[3*i], k.Counters[3*i+1] = uint64(i), uint64(i)<<16
	}
	d.clock.Nanos(1) // calibrated before timing
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now := time.Now()
		for _, t := range timers {
			d.tm.timerPoint(t, now)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)*10/1e9*100, "cpu_%_at_10Hz")
}

// A virtual timer: the function's entry and exit, and the switch hook at
// __switch_to's first instruction after its pushes; virtual time is wall
// minus off-CPU time; everything goes on removal.
func TestVirtualTimerSession(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kallsyms")
	syms := kallsyms + "ffffffff81200040 T __switch_to\nffffffff81200060 T after_switch\n"
	if err := os.WriteFile(path, []byte(syms), 0o600); err != nil {
		t.Fatal(err)
	}
	full := append(bytes.Clone(text), make([]byte, 0x40-len(text))...)
	for i := len(text); i < 0x40; i++ {
		full[i] = 0xcc
	}
	sw := []byte{0x41, 0x57, // push %r15
		0x65, 0x48, 0x8b, 0x04, 0x25, 0x80, 0xfb, 0x01, 0x00, // mov %gs:0x1fb80,%rax
		0x41, 0x5f, 0xc3} // pop %r15; ret
	full = append(full, sw...)
	for len(full) < 0x68 {
		full = append(full, 0xcc)
	}
	k := enginetest.New(textAddr, full)
	k.Counters = make([]uint64, 512)
	d, err := New(Config{Device: k, Kallsyms: path, Release: "test", Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		TaskLayout: func(*kernel.Symbols) (kernel.TaskLayout, error) {
			return kernel.TaskLayout{CurrentTask: 0x1fb80, PID: 0x5c8, TGID: 0x5cc, Comm: 0x7c0}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.CreateSession(api.SessionRequest{Timers: []string{"filename_lookup"}, Virtual: true})
	if err != nil {
		t.Fatal(err)
	}
	read := func(at uint64) byte { b := make([]byte, 1); k.Read(at, b); return b[0] }
	if read(textAddr+0x0b) != 0xe9 || read(textAddr+0x1f) != 0xe9 || read(textAddr+0x42) != 0xe9 {
		t.Fatal("want splices at the entry, the exit and __switch_to+0x2")
	}
	if !s.Timers[0].Virtual {
		t.Error("timer not marked virtual")
	}
	v := d.sessions[s.ID].timers[0].virtual
	k.Counters[v.base+vCalls] = 5
	k.Counters[v.base+vWall] = 3_000_000 << 16
	k.Counters[v.off] = 1_000_000 << 16
	pt := d.Sessions()[0].Timers[0].Totals
	if want := d.clock.Nanos(2_000_000); pt.Calls != 5 || math.Abs(pt.VirtualNS-want) > want*1e-6 {
		t.Fatalf("point %+v, want 5 calls and %.0f ns virtual", pt, want)
	}
	if _, err := d.RemoveSession(s.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	now := make([]byte, len(full))
	k.Read(textAddr, now)
	if !bytes.Equal(now, full) || len(k.Allocs) != 0 || d.eng.State().Counters != 0 {
		t.Fatalf("not restored: allocs %v slots %d", k.Allocs, d.eng.State().Counters)
	}
}
