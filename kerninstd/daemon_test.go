package kerninstd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/census"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/engine/enginetest"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/kerninstd/bench"
)

const textAddr = enginetest.TextAddr

// text is a filename_lookup shaped like the real one (enginetest.Text).
var text = enginetest.Text

const kallsyms = enginetest.Kallsyms

func newTestDaemon(t testing.TB) (*Daemon, *enginetest.Kernel) {
	t.Helper()
	k, path, err := enginetest.Fixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Device: k, Kallsyms: path, Release: "test", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return d, k
}

func textNow(t *testing.T, k *enginetest.Kernel) []byte {
	b := make([]byte, len(text))
	if err := k.Read(textAddr, b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSessionSplicesAndRestores(t *testing.T) {
	d, k := newTestDaemon(t)
	s, err := d.CreateSession(api.SessionRequest{Points: []string{"lookuppn"}})
	if err != nil {
		t.Fatal(err)
	}
	p := s.Probes[0]
	if p.Function != "filename_lookup" || p.Offset != 0x0b || p.Length != 7 || p.SpliceClass != "direct" || p.Classic == nil {
		t.Fatalf("probe = %+v; want the 7-byte load at +0xb", p)
	}
	if p.FlagsLive {
		t.Error("flags reported live at +0xb; test at +0x12 writes them all first")
	}
	now := textNow(t, k)
	want, _ := codegen.JmpRel32(textAddr+0x0b, uint64(p.Patch))
	if !bytes.Equal(now[0x0b:0x10], want) || !bytes.Equal(now[0x10:0x12], text[0x10:0x12]) {
		t.Fatalf("text at +0xb = %x, want %x then the original tail", now[0x0b:0x12], want)
	}
	if !bytes.Equal(now[:0x0b], text[:0x0b]) || !bytes.Equal(now[0x12:], text[0x12:]) {
		t.Fatal("bytes outside the spliced instruction changed")
	}
	code := make([]byte, k.Allocs[uint64(p.Patch)])
	if err := k.Read(uint64(p.Patch), code); err != nil {
		t.Fatal(err)
	}
	slot := d.sessions[s.ID].reqs[0].Counter()
	if err := codegen.Verify(trimPatch(code), uint64(p.Patch), codegen.Site{Addr: textAddr + 0x0b, Bytes: text[0x0b:0x12]}, k.CounterAddr(slot), false); err != nil {
		t.Errorf("installed patch does not verify: %v", err)
	}
	k.Counters[slot] = 42
	final, err := d.RemoveSession(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if final.Probes[0].Count != 42 {
		t.Errorf("final count %d, want 42", final.Probes[0].Count)
	}
	if !bytes.Equal(textNow(t, k), text) {
		t.Error("text not restored")
	}
	// Removed patches are freed in a batch shortly after (one RCU-tasks
	// wait in the driver for all of them).
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(k.AllocsNow()) != 0; {
		time.Sleep(10 * time.Millisecond)
	}
	if len(k.AllocsNow()) != 0 || len(k.Splices) != 0 || d.eng.State().Counters != 0 {
		t.Errorf("leaks: allocs %v splices %v state %+v", k.AllocsNow(), k.Splices, d.eng.State())
	}
}

// trimPatch drops the int3 fill after a patch.
func trimPatch(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == 0xcc {
		b = b[:len(b)-1]
	}
	return b
}

func TestRefusalsChangeNothing(t *testing.T) {
	d, k := newTestDaemon(t)
	for _, tc := range []struct{ point, code string }{
		{"nosuch", "unknown_function"},
		{"filename_lookup+0xc", "not_boundary"},
		{"filename_lookup+0x0", "no_splice"},
		{"exc_int3", "no_splice"},
		{"exc_int3+0x1", "no_splice"},
		{"filename_lookup+", "bad_request"},
	} {
		_, err := d.CreateSession(api.SessionRequest{Points: []string{tc.point}})
		if err == nil {
			t.Errorf("%s: accepted", tc.point)
			continue
		}
		if _, code := errorCode(err); code != tc.code {
			t.Errorf("%s: code %s (%v), want %s", tc.point, code, err, tc.code)
		}
	}
	if !bytes.Equal(textNow(t, k), text) || len(k.Allocs) != 0 {
		t.Error("a refused request changed the kernel")
	}
}

func TestSessionIsAllOrNothing(t *testing.T) {
	d, k := newTestDaemon(t)
	k.FailSplice = true
	_, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x1c", "lookuppn"}})
	if err == nil {
		t.Fatal("injected splice failure not reported")
	}
	if !bytes.Equal(textNow(t, k), text) || len(k.Allocs) != 0 || len(k.Splices) != 0 {
		t.Error("failed session left something behind")
	}
	if _, err := d.CreateSession(api.SessionRequest{Points: []string{"lookuppn"}}); err == nil {
		t.Fatal("injected splice failure not reported")
	}
	if len(k.Allocs) != 0 || d.eng.State().Counters != 0 {
		t.Error("failed splice leaked a patch or slot")
	}
}

func TestAPIAndTiedSession(t *testing.T) {
	d, k := newTestDaemon(t)
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()
	c := api.NewClient(strings.TrimPrefix(srv.URL, "http://"))
	ctx := context.Background()

	_, err := c.Resolve(ctx, "filename_lookup+0xc")
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.Code != "not_boundary" || !strings.Contains(ae.Error(), "+0xb") {
		t.Fatalf("resolve mid-instruction: %v", err)
	}
	s, err := c.CreateSession(ctx, api.SessionRequest{Points: []string{"lookuppn"}, Tied: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Samples(ctx, s.ID, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	k.Mu.Lock()
	for i := range k.Counters {
		k.Counters[i] += 7
	}
	k.Mu.Unlock()
	smp, err := st.Next()
	if err != nil || len(smp.Totals) != 1 {
		t.Fatalf("sample: %+v %v", smp, err)
	}
	m, err := c.Read(ctx, "filename_lookup+0xb", 5)
	if err != nil || !strings.HasPrefix(m.Bytes, "e9") || m.Symbol != "filename_lookup+0xb" {
		t.Errorf("read during splice: %+v %v", m, err)
	}
	// The client going away removes a tied session.
	st.Close()
	deadline := time.Now().Add(5 * time.Second)
	for d.Info().Splices != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if d.Info().Splices != 0 || !bytes.Equal(textNow(t, k), text) {
		t.Fatal("closing the stream of a tied session did not remove it")
	}
	if _, err := c.RemoveSession(ctx, s.ID); !errors.As(err, &ae) || ae.Code != "no_session" {
		t.Errorf("remove of a gone session: %v", err)
	}
}

func TestBenchSpliceFake(t *testing.T) {
	d, k := newTestDaemon(t)
	res, err := bench.Splice(context.Background(), benchKernel(d), api.BenchRequest{Point: "lookuppn", Cycles: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 50 || res.Splice.N != 50 || !res.Restored || len(k.Allocs) != 0 {
		t.Errorf("bench = %+v, allocs %v", res, k.Allocs)
	}
	if _, err := bench.Splice(context.Background(), benchKernel(d), api.BenchRequest{Point: "lookuppn", Cycles: 0}); err == nil {
		t.Error("zero cycles accepted")
	}
}

// TestBenchSpliceSteps: every Figure 4 step is timed, by the engine's
// hooks for the steps of each cycle's request; a springboard-class point
// takes and writes its slot every cycle; a covering point stays covering;
// text, slots, patches and the overlay are left as they were; a point
// already instrumented is refused.
func TestBenchSpliceSteps(t *testing.T) {
	const cycles = 20
	for _, tc := range []struct {
		point, class string
		spring       bool
	}{
		{"lookuppn", "direct", false},
		{"filename_lookup+0x9", "springboard", true},
		{"filename_lookup+0x5", "covering", false},
		{"next_fn", "trap", false},
	} {
		t.Run(tc.class, func(t *testing.T) {
			d, k := newTestDaemon(t)
			before := textNow(t, k)
			res, err := bench.Splice(context.Background(), benchKernel(d), api.BenchRequest{Point: tc.point, Cycles: cycles})
			if err != nil {
				t.Fatal(err)
			}
			if res.Point.SpliceClass != tc.class || res.Cycles != cycles {
				t.Errorf("class %s, %d cycles; want %s, %d", res.Point.SpliceClass, res.Cycles, tc.class, cycles)
			}
			if tc.class == "covering" && k.Covering != cycles {
				t.Errorf("%d covering splices, want one a cycle", k.Covering)
			}
			for name, got := range map[string]int{
				"resolve": res.Resolve.N, "liveness": res.Liveness.N, "codegen": res.Codegen.N, "relocation": res.Relocation.N,
				"patch alloc": res.PatchAlloc.N, "free": res.Free.N, "patch write": res.Patch.N,
				"splice": res.Splice.N, "unsplice": res.Unsplice.N,
			} {
				if got != cycles {
					t.Errorf("%s: %d timings, want %d", name, got, cycles)
				}
			}
			if want := map[bool]int{true: cycles}[tc.spring]; res.Springboard.N != want || res.SlotFind.N != want {
				t.Errorf("springboard: %d slot writes, %d slot finds; want %d", res.Springboard.N, res.SlotFind.N, want)
			}
			if !res.Restored || !bytes.Equal(textNow(t, k), before) {
				t.Error("text not restored")
			}
			if st := d.eng.State(); len(k.AllocsNow()) != 0 || st.Springboards != 0 || st.Overlay != 0 || st.Counters != 0 || st.Retired != 0 {
				t.Errorf("left behind: patches %v, state %+v", k.AllocsNow(), st)
			}
		})
	}
	d, k := newTestDaemon(t)
	s, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x6"}})
	if err != nil {
		t.Fatal(err)
	}
	withSession := textNow(t, k)
	if _, err := bench.Splice(context.Background(), benchKernel(d), api.BenchRequest{Point: "filename_lookup+0x6", Cycles: 2}); err == nil || !strings.Contains(err.Error(), s.ID) {
		t.Errorf("bench at a session's point: %v", err)
	}
	if !bytes.Equal(textNow(t, k), withSession) {
		t.Error("a refused bench changed the text")
	}
}

func TestFunctionCFG(t *testing.T) {
	d, _ := newTestDaemon(t)
	g, err := d.FunctionCFG("filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	if g.Function != "filename_lookup" || uint64(g.Address) != textAddr || len(g.Blocks) < 3 {
		t.Fatalf("cfg = %+v", g)
	}
	// je at +0x15 splits the entry block; the call at +0x17 does not end one.
	b0 := g.Blocks[0]
	if last := b0.Instructions[len(b0.Instructions)-1]; last.Offset != 0x15 || len(b0.Succs) != 2 {
		t.Errorf("entry block ends at +%#x with %d successors", last.Offset, len(b0.Succs))
	}
	byOff := map[uint64]api.CFGInstruction{}
	for _, b := range g.Blocks {
		for _, in := range b.Instructions {
			byOff[in.Offset] = in
		}
	}
	for off, want := range map[uint64]string{0x0: "refused", 0x5: "covering", 0x9: "springboard", 0xb: "direct", 0x1e: "covering"} {
		if got := byOff[off].SpliceClass; got != want {
			t.Errorf("+%#x: class %s, want %s", off, got, want)
		}
	}
	// With every slot in reach taken, a short instruction would get a
	// covering splice where its block allows, else a trap splice (the je
	// ends its block), and the view says so.
	for {
		if _, err := d.eng.Springboards().Alloc(textAddr + 0x9); err != nil {
			break
		}
	}
	if g2, err := d.FunctionCFG("filename_lookup"); err != nil {
		t.Fatal(err)
	} else {
		for _, in := range g2.Blocks[0].Instructions {
			if want := map[uint64]string{0x9: "covering", 0x15: "trap"}[in.Offset]; want != "" && in.SpliceClass != want {
				t.Errorf("+%#x with no slot free: class %s, want %s", in.Offset, in.SpliceClass, want)
			}
		}
	}
	if in := byOff[0x15]; len(in.LiveIn) == 0 {
		t.Errorf("je: no live flags")
	}
	if in := byOff[0x1f]; in.Target != "exc_int3+0x3" {
		t.Errorf("jmp target not named: %+v", in)
	}
	if _, err := d.FunctionCFG("nosuch"); !errors.Is(err, kernel.ErrUnknownFunction) {
		t.Errorf("unknown function: %v", err)
	}
}

// gnuNote is an ELF note holding a GNU build id, as /sys/kernel/notes has.
func gnuNote(id []byte) []byte {
	var b []byte
	le := func(v uint32) { b = append(b, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
	// A Xen note first, to be skipped.
	le(4)
	le(4)
	le(1)
	b = append(b, "Xen\x00"...)
	b = append(b, 1, 2, 3, 4)
	le(4)
	le(uint32(len(id)))
	le(3)
	b = append(b, "GNU\x00"...)
	return append(b, id...)
}

func TestAnalysisCache(t *testing.T) {
	dir := t.TempDir()
	notes := filepath.Join(dir, "notes")
	os.WriteFile(notes, gnuNote([]byte{0xde, 0xad, 0xbe, 0xef}), 0o600)
	mods := filepath.Join(dir, "modules")
	os.WriteFile(mods, []byte("virtio_net 57344 0 - Live 0xffffffffc0000000\n"), 0o600)
	if id, err := buildID(gnuNote([]byte{1, 2})); err != nil || id != "0102" {
		t.Fatalf("buildID = %q, %v", id, err)
	}

	d, _ := newTestDaemon(t)
	d.an.cacheDir, d.an.notesPath, d.an.modulesPath = filepath.Join(dir, "cache"), notes, mods
	d.Prepare(context.Background(), true)
	if d.an.stats == nil || d.an.stats.Functions == 0 {
		t.Fatalf("Prepare computed no census: %+v", d.an.stats)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "cache", "analysis-deadbeef-*.json"))
	if len(files) != 1 {
		t.Fatalf("cache files: %v", files)
	}
	// A restarted daemon loads it instead of analysing again.
	d2, _ := newTestDaemon(t)
	d2.an.cacheDir, d2.an.notesPath, d2.an.modulesPath = d.an.cacheDir, notes, mods
	st, ok, err := d2.an.loadAnalysis()
	if err != nil || !ok || st.Functions != d.an.stats.Functions {
		t.Errorf("loadAnalysis = %+v, %v, %v", st, ok, err)
	}
	// Another module set is another cache entry.
	os.WriteFile(mods, []byte("virtio_net 1 0 - Live 0x0\nnf_tables 1 0 - Live 0x0\n"), 0o600)
	if _, ok, _ := d2.an.loadAnalysis(); ok {
		t.Error("cache hit for a different module set")
	}
}

// BenchmarkLoadAnalysis measures a restarted kerninstd's cached load of
// the whole-kernel analysis: here 50,000 callee summaries and 5,000
// never-returning functions, more than a real kernel has:
//
//	go test -run XXX -bench LoadAnalysis ./kerninstd
func BenchmarkLoadAnalysis(b *testing.B) {
	dir := b.TempDir()
	notes := filepath.Join(dir, "notes")
	os.WriteFile(notes, gnuNote([]byte{1, 2, 3, 4}), 0o600)
	mods := filepath.Join(dir, "modules")
	os.WriteFile(mods, nil, 0o600)
	path := filepath.Join(dir, "kallsyms")
	var ks strings.Builder
	ks.WriteString("ffffffff81000000 T _text\n" + kallsyms)
	noret := cfg.NoReturnSet{}
	reads := cfg.CalleeReads{}
	for i := 0; i < 50000; i++ {
		a := uint64(0xffffffff82000000) + uint64(i)*0x40
		fmt.Fprintf(&ks, "%x t fn%d\n", a, i)
		reads[a] = cfg.LiveSet(i)
		if i%10 == 0 {
			noret[a] = true
		}
	}
	os.WriteFile(path, []byte(ks.String()), 0o600)
	d, err := New(Config{Device: enginetest.New(textAddr, text), Kallsyms: path, Release: "test",
		CacheDir: filepath.Join(dir, "cache"), Notes: notes, Modules: mods, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.an.saveAnalysis(d.plan.Symbols(), census.Stats{Functions: 47166}, noret, reads); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, err := d.an.loadAnalysis(); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
	b.StopTimer()
	if gotNoret, gotReads := d.plan.Analysis(); len(gotNoret) != len(noret) || len(gotReads) != len(reads) {
		b.Fatalf("loaded %d never-returning functions and %d summaries, saved %d and %d", len(gotNoret), len(gotReads), len(noret), len(reads))
	}
}

func TestBlockPoints(t *testing.T) {
	d, k := newTestDaemon(t)
	for _, tc := range []struct {
		point string
		off   uint64
		code  string
	}{
		{point: "filename_lookup:0", off: 0x0b},         // entry block: the first direct-capable instruction
		{point: "filename_lookup:1", off: 0x17},         // the call
		{point: "filename_lookup:2", off: 0x1f},         // pop, pop, jmp: the jmp is the direct one
		{point: "filename_lookup:3", code: "no_splice"}, // padding
		{point: "filename_lookup:99", code: "bad_request"},
	} {
		r, err := d.Resolve(tc.point)
		if tc.code != "" {
			if _, code := errorCode(err); code != tc.code {
				t.Errorf("%s: %v (%s), want %s", tc.point, err, code, tc.code)
			}
			continue
		}
		if err != nil || r.Offset != tc.off {
			t.Errorf("%s: %+v %v, want +%#x", tc.point, r, err, tc.off)
		}
	}
	if !bytes.Equal(textNow(t, k), text) {
		t.Error("resolving changed the text")
	}
}

// reclaim frees retired patches now, as the engine's timer would.
func reclaim(d *Daemon) { d.eng.Reclaim() }

// TestAnalysisSeesOriginalBytes: once points of a function are spliced,
// later requests in the same function (and at the same trap point) are
// resolved against the original code, not the jmp/int3 written over it.
func TestAnalysisSeesOriginalBytes(t *testing.T) {
	d, k := newTestDaemon(t)
	a, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0xb", "filename_lookup+0x1e", "filename_lookup+0x9"}})
	if err != nil {
		t.Fatal(err)
	}
	// +0x10 lies inside the 7-byte load the jmp rel32 replaced: still
	// not a boundary; +0x12 still is.
	if _, err := d.Resolve("filename_lookup+0x10"); !errors.Is(err, cfg.ErrNotBoundary) {
		t.Errorf("+0x10 under a splice: %v, want not a boundary", err)
	}
	b, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x12", "filename_lookup+0x1e", "filename_lookup+0x9"}})
	if err != nil {
		t.Fatalf("second session in a spliced function: %v", err)
	}
	if b.Probes[1].Instruction != "pop %rbp" || b.Probes[1].SpliceClass != "covering" || b.Probes[2].SpliceClass != "springboard" {
		t.Errorf("second requests resolved to %+v", b.Probes)
	}
	c, err := d.FunctionCFG("filename_lookup")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Blocks[0].Instructions[4].Text; !strings.HasPrefix(got, "mov 0x302010(%rip)") {
		t.Errorf("cfg shows %q at +0xb, want the original load", got)
	}
	for _, id := range []string{a.ID, b.ID} {
		if _, err := d.RemoveSession(id); err != nil {
			t.Fatal(err)
		}
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || d.eng.State().Overlay != 0 {
		t.Errorf("not restored (state %+v)", d.eng.State())
	}
}

// hitsAsRemoved is a kernel whose probed code runs once more at every
// point while the session's splices are being taken out: hits kerninstd
// can only see if it reads the counts after the splices went.
type hitsAsRemoved struct {
	*enginetest.Kernel
	addrs []uint64
}

func (k *hitsAsRemoved) UnspliceBatch(ids []uint32) error {
	addrs := k.addrs
	k.addrs = nil // once: the first batch takes out the splices they go through
	for _, a := range addrs {
		if err := k.Count(a, 1); err != nil {
			return err
		}
	}
	return k.Kernel.UnspliceBatch(ids)
}

// A session's final counts are read as its splices go, not before: two
// points of one straight-line path end equal, the hits made while the
// removal ran included. Read before, both missed the last hit.
func TestFinalCountsAfterRemoval(t *testing.T) {
	k, path, err := enginetest.Fixture(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dev := &hitsAsRemoved{Kernel: k}
	d, err := New(Config{Device: dev, Kallsyms: path, Release: "test", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0xb", "filename_lookup+0x12"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range s.Probes {
		if err := k.Count(uint64(p.Address), 10); err != nil {
			t.Fatal(err)
		}
		dev.addrs = append(dev.addrs, uint64(p.Address))
	}
	final, err := d.RemoveSession(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range final.Probes {
		if p.Count != 11 {
			t.Errorf("%s: final count %d, want 11 (10 before the removal, 1 during it)", p.Point, p.Count)
		}
	}
}

// TestTiedSessionUnclaimed: a tied session ends with its client's sample
// stream, so one whose client never opens that stream must not outlive
// it: a client gone while its session was made (killed while a whole
// kernel's coverage armed) had left it spliced until a detach by hand.
// The session is removed at once when the request's client is gone by
// the time it is made, and after TiedGrace when no stream comes.
func TestTiedSessionUnclaimed(t *testing.T) {
	d, k := newTestDaemon(t)
	srv := httptest.NewServer(d.Handler())
	defer srv.Close()

	// Gone while it was made: the request's context is over when the
	// session exists.
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/v1/sessions", strings.NewReader(`{"points":["lookuppn"],"tied":true}`)).WithContext(gone)
	d.Handler().ServeHTTP(rec, req)
	if rec.Code == 201 || !strings.Contains(rec.Body.String(), "went away") || d.Info().Splices != 0 || !bytes.Equal(textNow(t, k), text) {
		t.Errorf("a tied session whose client went away while it was made: status %d, %d splices left\n%s", rec.Code, d.Info().Splices, rec.Body.String())
	}

	// Made, but no stream comes: removed after the grace; a session
	// whose stream came stays.
	defer func(g time.Duration) { TiedGrace = g }(TiedGrace)
	TiedGrace = 100 * time.Millisecond
	c := api.NewClient(strings.TrimPrefix(srv.URL, "http://"))
	ctx := context.Background()
	orphan, err := c.CreateSession(ctx, api.SessionRequest{Points: []string{"lookuppn"}, Tied: true, Name: "orphan"})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := c.CreateSession(ctx, api.SessionRequest{Points: []string{"filename_lookup+0xb"}, Tied: true, Name: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	st, err := c.Samples(ctx, kept.ID, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(5 * time.Second)
	for len(d.Sessions()) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ss := d.Sessions()
	if len(ss) != 1 || ss[0].ID != kept.ID {
		t.Errorf("sessions after the grace: %+v; want only %s (%s unclaimed)", ss, kept.ID, orphan.ID)
	}
}
