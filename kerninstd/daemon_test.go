package kerninstd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
)

const textAddr = 0xffffffff81200000

// A filename_lookup shaped like the real one: ftrace nop, short prologue
// instructions, then a 7-byte RIP-relative load (the entry point), a test
// and branch, a call, and a return-thunk jump.
var text = []byte{
	0x0f, 0x1f, 0x44, 0x00, 0x00, // +0x00 nopl (ftrace site)
	0x55,             // +0x05 push %rbp
	0x48, 0x89, 0xe5, // +0x06 mov %rsp,%rbp
	0x41, 0x54, // +0x09 push %r12
	0x48, 0x8b, 0x05, 0x10, 0x20, 0x30, 0x00, // +0x0b mov 0x302010(%rip),%rax
	0x48, 0x85, 0xc0, // +0x12 test %rax,%rax
	0x74, 0x05, // +0x15 je +0x1c
	0xe8, 0x00, 0x01, 0x00, 0x00, // +0x17 call
	0x41, 0x5c, // +0x1c pop %r12
	0x5d,                         // +0x1e pop %rbp
	0xe9, 0x10, 0x00, 0x00, 0x00, // +0x1f jmp (return thunk)
	0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, // padding to +0x30
	0xc3, // +0x30 next_fn: ret
}

const kallsyms = `ffffffff81200000 T filename_lookup
ffffffff81200030 T next_fn
ffffffff81200031 T exc_int3
`

func newTestDaemon(t testing.TB) (*Daemon, *fakeKernel) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(kallsyms), 0o600); err != nil {
		t.Fatal(err)
	}
	full := append(bytes.Clone(text), 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90, 0x90)
	k := newFakeKernel(textAddr, full)
	d, err := New(Config{Device: k, Kallsyms: path, Release: "test", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return d, k
}

func textNow(t *testing.T, k *fakeKernel) []byte {
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
	code := make([]byte, k.allocs[uint64(p.Patch)])
	if err := k.Read(uint64(p.Patch), code); err != nil {
		t.Fatal(err)
	}
	var slot int
	for s := range d.slots.used {
		slot = s
	}
	if err := codegen.Verify(trimPatch(code), uint64(p.Patch), codegen.Site{Addr: textAddr + 0x0b, Bytes: text[0x0b:0x12]}, k.CounterAddr(slot), false); err != nil {
		t.Errorf("installed patch does not verify: %v", err)
	}
	k.counters[slot] = 42
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
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && len(allocs(k)) != 0; {
		time.Sleep(10 * time.Millisecond)
	}
	if len(allocs(k)) != 0 || len(k.splices) != 0 || len(d.slots.used) != 0 {
		t.Errorf("leaks: allocs %v splices %v slots %v", k.allocs, k.splices, d.slots.used)
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
	if !bytes.Equal(textNow(t, k), text) || len(k.allocs) != 0 {
		t.Error("a refused request changed the kernel")
	}
}

func TestSessionIsAllOrNothing(t *testing.T) {
	d, k := newTestDaemon(t)
	k.failSplice = true
	_, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x1c", "lookuppn"}})
	if err == nil {
		t.Fatal("injected splice failure not reported")
	}
	if !bytes.Equal(textNow(t, k), text) || len(k.allocs) != 0 || len(k.splices) != 0 {
		t.Error("failed session left something behind")
	}
	if _, err := d.CreateSession(api.SessionRequest{Points: []string{"lookuppn"}}); err == nil {
		t.Fatal("injected splice failure not reported")
	}
	if len(k.allocs) != 0 || len(d.slots.used) != 0 {
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
	k.mu.Lock()
	for i := range k.counters {
		k.counters[i] += 7
	}
	k.mu.Unlock()
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
	res, err := d.BenchSplice(context.Background(), api.BenchRequest{Point: "lookuppn", Cycles: 50})
	if err != nil {
		t.Fatal(err)
	}
	if res.Cycles != 50 || res.Splice.N != 50 || !res.Restored || len(k.allocs) != 0 {
		t.Errorf("bench = %+v, allocs %v", res, k.allocs)
	}
	if _, err := d.BenchSplice(context.Background(), api.BenchRequest{Point: "lookuppn", Cycles: 0}); err == nil {
		t.Error("zero cycles accepted")
	}
}

// TestBenchSpliceSteps: every Figure 4 step is timed; a springboard-class
// point writes its slot every cycle and leaves text, slots and patches as
// they were; a direct point takes no springboard step.
func TestBenchSpliceSteps(t *testing.T) {
	for _, tc := range []struct {
		point, class string
		spring       bool
	}{
		{"lookuppn", "direct", false},
		{"filename_lookup+0x9", "springboard", true},
		{"filename_lookup+0x5", "trap", false},
	} {
		t.Run(tc.class, func(t *testing.T) {
			d, k := newTestDaemon(t)
			before := textNow(t, k)
			res, err := d.BenchSplice(context.Background(), api.BenchRequest{Point: tc.point, Cycles: 20})
			if err != nil {
				t.Fatal(err)
			}
			if res.Point.SpliceClass != tc.class {
				t.Errorf("class %s, want %s", res.Point.SpliceClass, tc.class)
			}
			for name, got := range map[string]int{
				"resolve": res.Resolve.N, "liveness": res.Liveness.N, "codegen": res.Codegen.N, "relocation": res.Relocation.N,
				"patch alloc": res.PatchAlloc.N, "free": res.Free.N, "patch write": res.Patch.N,
				"splice": res.Splice.N, "unsplice": res.Unsplice.N,
			} {
				want := map[string]int{"patch alloc": benchPatches, "free": benchPatches, "patch write": 1}[name]
				if want == 0 {
					want = 20
				}
				if got != want {
					t.Errorf("%s: %d timings, want %d", name, got, want)
				}
			}
			if wantSlot := map[bool]int{true: 20}[tc.spring]; res.Springboard.N != wantSlot || (res.SlotFind.N == 1) != tc.spring {
				t.Errorf("springboard: %d slot writes, %d slot finds", res.Springboard.N, res.SlotFind.N)
			}
			if !res.Restored || !bytes.Equal(textNow(t, k), before) {
				t.Error("text not restored")
			}
			if len(k.allocs) != 0 || d.spring.InUse() != 0 || len(d.ov.orig) != 0 {
				t.Errorf("left behind: patches %v, %d slots, overlay %v", k.allocs, d.spring.InUse(), d.ov.orig)
			}
		})
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
		if _, err := d.spring.Alloc(textAddr + 0x9); err != nil {
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
	d.cacheDir, d.notesPath, d.modulesPath = filepath.Join(dir, "cache"), notes, mods
	d.Prepare(context.Background(), true)
	if d.stats == nil || d.stats.Functions == 0 {
		t.Fatalf("Prepare computed no census: %+v", d.stats)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "cache", "analysis-deadbeef-*.json"))
	if len(files) != 1 {
		t.Fatalf("cache files: %v", files)
	}
	// A restarted daemon loads it instead of analysing again.
	d2, _ := newTestDaemon(t)
	d2.cacheDir, d2.notesPath, d2.modulesPath = d.cacheDir, notes, mods
	st, ok, err := d2.loadAnalysis()
	if err != nil || !ok || st.Functions != d.stats.Functions {
		t.Errorf("loadAnalysis = %+v, %v, %v", st, ok, err)
	}
	// Another module set is another cache entry.
	os.WriteFile(mods, []byte("virtio_net 1 0 - Live 0x0\nnf_tables 1 0 - Live 0x0\n"), 0o600)
	if _, ok, _ := d2.loadAnalysis(); ok {
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
	d, err := New(Config{Device: newFakeKernel(textAddr, text), Kallsyms: path, Release: "test",
		CacheDir: filepath.Join(dir, "cache"), Notes: notes, Modules: mods, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	if err := d.saveAnalysis(d.symbols(), cfg.Stats{Functions: 47166}, noret, reads); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, ok, err := d.loadAnalysis(); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
	b.StopTimer()
	if n := len(d.noret); n != len(noret) || len(d.reads) != len(reads) {
		b.Fatalf("loaded %d never-returning functions and %d summaries, saved %d and %d", n, len(d.reads), len(noret), len(reads))
	}
}

// patchAt reads the installed patch of a probe.
func patchAt(t *testing.T, k *fakeKernel, p api.Probe) []byte {
	t.Helper()
	code := make([]byte, k.allocs[uint64(p.Patch)])
	if err := k.Read(uint64(p.Patch), code); err != nil {
		t.Fatal(err)
	}
	return code
}

// countIncs counts "lock incq" instructions of the patch's instrumentation
// and checks every one addresses a slot in use.
func countIncs(t *testing.T, d *Daemon, k *fakeKernel, code []byte, at uint64) int {
	t.Helper()
	n := 0
	for off := 0; off+8 <= len(code); {
		if bytes.HasPrefix(code[off:], []byte{0xf0, 0x48, 0xff, 0x05}) {
			tgt := at + uint64(off) + 8 + uint64(int64(int32(uint32(code[off+4])|uint32(code[off+5])<<8|uint32(code[off+6])<<16|uint32(code[off+7])<<24)))
			found := false
			for s := range d.slots.used {
				found = found || k.CounterAddr(s) == tgt
			}
			if !found {
				t.Errorf("lock incq at +%d addresses %#x, no slot in use", off, tgt)
			}
			n++
			off += 8
			continue
		}
		off++
	}
	return n
}

// TestSharedPatch: two sessions at one point share one splice; each
// change builds a new patch and re-points the splice; the last removal
// restores the text.
func TestSharedPatch(t *testing.T) {
	d, k := newTestDaemon(t)
	a, err := d.CreateSession(api.SessionRequest{Points: []string{"lookuppn"}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0xb", "filename_lookup+0xb"}})
	if err != nil {
		t.Fatal(err)
	}
	if k.spliceCalls != 1 || k.resplices != 2 || len(k.splices) != 1 {
		t.Fatalf("splices %d, resplices %d, installed %d; want 1, 2, 1", k.spliceCalls, k.resplices, len(k.splices))
	}
	reclaim(d)
	if len(k.allocs) != 1 {
		t.Errorf("%d patches allocated; replaced patches must be freed", len(k.allocs))
	}
	pb := b.Probes[0]
	code := patchAt(t, k, pb)
	if n := countIncs(t, d, k, code, uint64(pb.Patch)); n != 3 {
		t.Errorf("shared patch has %d counters, want 3", n)
	}
	now := textNow(t, k)
	want, _ := codegen.JmpRel32(textAddr+0x0b, uint64(pb.Patch))
	if !bytes.Equal(now[0x0b:0x10], want) {
		t.Errorf("splice jumps %x, want %x (the newest patch)", now[0x0b:0x10], want)
	}
	if _, err := d.RemoveSession(a.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	if len(k.splices) != 1 || k.resplices != 3 {
		t.Fatalf("after removing one session: installed %d, resplices %d", len(k.splices), k.resplices)
	}
	var patch uint64
	for p := range k.allocs {
		patch = p
	}
	code = make([]byte, k.allocs[patch])
	k.Read(patch, code)
	if n := countIncs(t, d, k, code, patch); n != 2 {
		t.Errorf("patch after removal has %d counters, want 2", n)
	}
	if _, err := d.RemoveSession(b.ID); err != nil {
		t.Fatal(err)
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || len(k.allocs) != 0 || len(k.splices) != 0 || len(d.slots.used) != 0 || len(d.points) != 0 {
		t.Errorf("not restored: allocs %v splices %v slots %v points %d", k.allocs, k.splices, d.slots.used, len(d.points))
	}
}

// TestTrapSplice: a 1-byte instruction takes a trap splice: one int3, a
// patch with the counter and the relocated instruction.
func TestTrapSplice(t *testing.T) {
	d, k := newTestDaemon(t)
	// next_fn is one ret: no slot, no run to cover.
	s, err := d.CreateSession(api.SessionRequest{Points: []string{"next_fn"}})
	if err != nil {
		t.Fatal(err)
	}
	p := s.Probes[0]
	if p.SpliceClass != "trap" || p.Springboard != 0 {
		t.Errorf("class %s (springboard %#x), want trap", p.SpliceClass, p.Springboard)
	}
	now := textNow(t, k)
	if now[0x30] != 0xcc || !bytes.Equal(now[:0x30], text[:0x30]) {
		t.Errorf("text = % x, want one int3 at +0x30", now)
	}
	code := patchAt(t, k, p)
	site := codegen.Site{Addr: textAddr + 0x30, Bytes: text[0x30:0x31]}
	var slot int
	for s := range d.slots.used {
		slot = s
	}
	if err := codegen.Verify(code, uint64(p.Patch), site, k.CounterAddr(slot), p.FlagsLive); err != nil {
		t.Errorf("trap patch: %v", err)
	}
	if _, err := d.RemoveSession(s.ID); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(textNow(t, k), text) {
		t.Error("text not restored")
	}
}

// TestSpringboardSplices: short instructions get slots in the padding
// after the function's last jmp (12 int3 bytes: two slots) while slots
// last, then trap splices; a second request at a springboard point
// re-points its slot; removal restores text and slots.
func TestSpringboardSplices(t *testing.T) {
	d, k := newTestDaemon(t)
	s, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x9", "filename_lookup+0x12", "filename_lookup+0x1c"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"springboard", "springboard", "trap"}
	now := textNow(t, k)
	for i, p := range s.Probes {
		if p.SpliceClass != want[i] {
			t.Errorf("%s: class %s, want %s", p.Point, p.SpliceClass, want[i])
		}
		off := p.Offset
		if p.SpliceClass != "springboard" {
			continue
		}
		slot := uint64(p.Springboard)
		if slot < textAddr+0x24 || slot+5 > textAddr+0x30 {
			t.Errorf("%s: slot %#x outside the padding", p.Point, slot)
			continue
		}
		if now[off] != 0xeb || textAddr+off+2+uint64(int64(int8(now[off+1]))) != slot {
			t.Errorf("%s: text % x, want jmp rel8 to %#x", p.Point, now[off:off+2], slot)
		}
		so := slot - textAddr
		if jmp, _ := codegen.JmpRel32(slot, uint64(p.Patch)); !bytes.Equal(now[so:so+5], jmp) {
			t.Errorf("%s: slot holds % x, want jmp to the patch %#x", p.Point, now[so:so+5], uint64(p.Patch))
		}
	}
	if d.spring.InUse() != 2 {
		t.Errorf("%d slots in use, want 2", d.spring.InUse())
	}
	// A second request at a springboard point: the slot is re-pointed.
	before := k.resplices
	s2, err := d.CreateSession(api.SessionRequest{Points: []string{"filename_lookup+0x9"}})
	if err != nil {
		t.Fatal(err)
	}
	p2 := s2.Probes[0]
	if k.resplices != before+1 || p2.Springboard != s.Probes[0].Springboard {
		t.Errorf("resplices %d→%d, slot %#x (was %#x)", before, k.resplices, p2.Springboard, s.Probes[0].Springboard)
	}
	so := uint64(p2.Springboard) - textAddr
	if jmp, _ := codegen.JmpRel32(uint64(p2.Springboard), uint64(p2.Patch)); !bytes.Equal(textNow(t, k)[so:so+5], jmp) {
		t.Error("slot not re-pointed at the new patch")
	}
	if n := countIncs(t, d, k, patchAt(t, k, p2), uint64(p2.Patch)); n != 2 {
		t.Errorf("shared springboard patch has %d counters, want 2", n)
	}
	for _, id := range []string{s.ID, s2.ID} {
		if _, err := d.RemoveSession(id); err != nil {
			t.Fatal(err)
		}
	}
	if d.spring.InUse() != 2 {
		t.Errorf("slots returned before the patches were freed (%d in use)", d.spring.InUse())
	}
	reclaim(d)
	if !bytes.Equal(textNow(t, k), text) || len(k.splices) != 0 || len(k.allocs) != 0 || d.spring.InUse() != 0 {
		t.Errorf("not restored: splices %v allocs %v slots %d", k.splices, k.allocs, d.spring.InUse())
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

// reclaim frees retired patches now, as the daemon's timer would.
func reclaim(d *Daemon) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.reclaimLocked()
}

func allocs(k *fakeKernel) map[uint64]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.allocs)
}

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
	if !bytes.Equal(textNow(t, k), text) || len(d.ov.orig) != 0 {
		t.Errorf("not restored (overlay %v)", d.ov.orig)
	}
}
