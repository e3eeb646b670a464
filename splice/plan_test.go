package splice

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/springboard"
)

// kallsymsFixture is a few functions, core kernel and one module.
const kallsymsFixture = `ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81001000 t helper
ffffffff81001040 T filename_lookup
ffffffff81001040 D not_text
ffffffff810010c0 T next_fn
ffffffffc0001000 t helper	[virtio_net]
ffffffffc0001100 t modfn	[virtio_net]
`

// The planner's fixture kernel: functions at base, the static-call and
// exception tables at tables.
const (
	base   = 0xffffffff81000000
	tables = 0xffffffff82000000
)

// text lays out the fixture's functions (offsets from base).
var text = func() []byte {
	b := make([]byte, 0xa0)
	for i := range b {
		b[i] = 0xcc
	}
	put := func(off int, code ...byte) { copy(b[off:], code) }
	// f: an entry block of short instructions; block 1 starts with a
	// static call site, then a 2-byte, a 7-byte and a 2-byte
	// instruction; block 2 is pop, ret; 16 bytes of padding after the
	// ret (three springboard slots, in reach of all of f).
	put(0x00, 0x0f, 0x1f, 0x44, 0x00, 0x00)    // +0x00 nopl: the ftrace site, by its shape
	put(0x05, 0x55)                            // +0x05 push %rbp
	put(0x06, 0x48, 0x89, 0xe5)                // +0x06 mov %rsp,%rbp
	put(0x09, 0x48, 0x85, 0xff)                // +0x09 test %rdi,%rdi
	put(0x0c, 0x74, 0x10)                      // +0x0c je +0x1e
	put(0x0e, 0xe8, 0x00, 0x10, 0x00, 0x00)    // +0x0e call: a static call site
	put(0x13, 0x89, 0xc3)                      // +0x13 mov %eax,%ebx
	put(0x15, 0x48, 0x8b, 0x05, 0x10, 0, 0, 0) // +0x15 mov 0x10(%rip),%rax
	put(0x1c, 0x31, 0xc0)                      // +0x1c xor %eax,%eax
	put(0x1e, 0x5d)                            // +0x1e pop %rbp
	put(0x1f, 0xc3)                            // +0x1f ret; +0x20..+0x24 int3 (SLS), then nopl: padding
	put(0x24, 0x0f, 0x1f, 0x40, 0x00, 0x0f, 0x1f, 0x40, 0x00, 0x0f, 0x1f, 0x40, 0x00)
	// g: an int3 someone else put there, then ret.
	put(0x30, 0xcc, 0xc3)
	// h: an indirect jump not resolved to a table.
	put(0x40, 0x55, 0x48, 0x89, 0xe5, 0xff, 0xe0) // push; mov; jmp *%rax
	// exc_int3 and nifn (in noinstr text): ordinary code, refused by name
	// and by section.
	put(0x50, 0x48, 0x8b, 0x05, 0x10, 0, 0, 0, 0xc3)
	put(0x60, 0x48, 0x8b, 0x05, 0x10, 0, 0, 0, 0xc3)
	// u: ud2 (codegen cannot relocate it), then a covering run whose
	// second instruction an exception fixup lands on.
	put(0x70, 0x0f, 0x0b)       // +0x70 ud2
	put(0x72, 0x55)             // +0x72 push %rbp
	put(0x73, 0x48, 0x89, 0xe5) // +0x73 mov %rsp,%rbp: a fixup's landing
	put(0x76, 0x48, 0x85, 0xff) // +0x76 test %rdi,%rdi
	put(0x79, 0xc3)             // +0x79 ret
	// v: a symbol starts inside what a covering run would take.
	put(0x80, 0x55, 0x48, 0x89, 0xe5, 0x48, 0x85, 0xff, 0xc3)
	return b
}()

const fixtureSyms = `ffffffff81000000 T _text
ffffffff81000000 T f
ffffffff81000030 T g
ffffffff81000040 T h
ffffffff81000050 T exc_int3
ffffffff81000060 T __noinstr_text_start
ffffffff81000060 T nifn
ffffffff81000070 T __noinstr_text_end
ffffffff81000070 T u
ffffffff81000080 T v
ffffffff810000a0 T _etext
ffffffff82000000 D __start_static_call_sites
ffffffff82000008 D __stop_static_call_sites
ffffffff82000008 R __start___ex_table
ffffffff82000014 R __stop___ex_table
ffffffffc0000000 t drvfn	[kerninst]
`

// memText serves the fixture's text, its tables and a module function.
type memText map[uint64][]byte // base → bytes

func (m memText) Read(addr uint64, b []byte) error {
	for at, data := range m {
		if addr >= at && addr+uint64(len(b)) <= at+uint64(len(data)) {
			copy(b, data[addr-at:])
			return nil
		}
	}
	return errors.New("unmapped")
}

func fixtureText() memText {
	rel := func(field, target uint64) uint32 { return uint32(int32(int64(target - field))) }
	tab := make([]byte, 8+12)
	binary.LittleEndian.PutUint32(tab[0:], rel(tables, base+0x0e))     // static call site f+0x0e
	binary.LittleEndian.PutUint32(tab[8:], rel(tables+8, base+0x60))   // an ex_table entry (in nifn)...
	binary.LittleEndian.PutUint32(tab[12:], rel(tables+12, base+0x73)) // ...whose fixup lands on u+0x3
	drv := []byte{0x48, 0x8b, 0x05, 0x10, 0, 0, 0, 0xc3}
	return memText{base: text, tables: tab, 0xffffffffc0000000: drv}
}

// newFixturePlanner plans against the fixture with a springboard heap.
func newFixturePlanner(t *testing.T) (*Planner, *springboard.Heap) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kallsyms")
	if err := os.WriteFile(path, []byte(fixtureSyms), 0o600); err != nil {
		t.Fatal(err)
	}
	heap := springboard.NewHeap()
	view, err := kernel.Live(fixtureText(), kernel.LiveOptions{Kallsyms: path})
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{Kernel: view, Springboards: heap, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return p, heap
}

// TestResolve: which instruction a point names, its class, and why a
// point is refused (the no-splice rules, the error a caller maps to an
// API code).
func TestResolve(t *testing.T) {
	p, _ := newFixturePlanner(t)
	for _, tc := range []struct {
		point string
		off   uint64 // the instruction chosen, from its function
		class string
		err   error  // errors.Is
		why   string // in the error
	}{
		// The entry: the cheapest class in the entry block after the
		// ftrace site (no direct one: a springboard).
		{point: "f", off: 0x06, class: "springboard"},
		// A block: its cheapest instruction, here the 7-byte load, not
		// the static call site the block starts with.
		{point: "f:1", off: 0x15, class: "direct"},
		{point: "f:2", off: 0x1e, class: "trap"},
		{point: "f:3", err: ErrNoSplice, why: "padding"},
		{point: "f:99", err: ErrBadPoint, why: "not 99"},
		{point: "f+0x5", off: 0x05, class: "covering"},
		{point: "f+0x15", off: 0x15, class: "direct"},
		{point: "f+0x0", err: ErrNoSplice, why: "ftrace site"},
		{point: "f+0xe", err: ErrNoSplice, why: "static call"},
		{point: "f+0x22", err: ErrNoSplice, why: "an int3 is already there"},
		{point: "f+0x24", err: ErrNoSplice, why: "padding between functions"},
		{point: "f+0x7", err: cfg.ErrNotBoundary},
		{point: "g", err: ErrNoEntryInstruction},
		{point: "g+0x0", err: ErrNoSplice, why: "an int3 is already there"},
		{point: "exc_int3", err: ErrNoSplice, why: "int3 / die-notifier path"},
		{point: "nifn", err: ErrNoSplice, why: "__noinstr_text_start"},
		{point: "nifn+0x0", err: ErrNoSplice, why: "exception-table"},
		{point: "drvfn", err: ErrNoSplice, why: "kinst's own driver text"},
		{point: "nosuch", err: kernel.ErrUnknownFunction},
		{point: "f+", err: ErrBadPoint},
	} {
		s, err := p.Resolve(tc.point)
		if tc.err != nil {
			if !errors.Is(err, tc.err) || !strings.Contains(errString(err), tc.why) {
				t.Errorf("%s: %v, want %v mentioning %q", tc.point, err, tc.err, tc.why)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.point, err)
			continue
		}
		if off := s.Addr() - s.Fn.Addr; off != tc.off || s.Class.String() != tc.class {
			t.Errorf("%s: +%#x %s, want +%#x %s", tc.point, off, s.Class, tc.off, tc.class)
		}
	}
}

// TestResolveProcess: a process's text has no ftrace, no kernel tables
// and no kernel no-instrumentation lists. The fixture's text planned as a
// process's (Facts.Process, and no owned sites, as process.Target plans):
// f's 5-byte nop is an ordinary direct site, a function named like the
// kernel's int3 path or in its noinstr section is spliceable, and an int3
// someone else put there is still refused.
func TestResolveProcess(t *testing.T) {
	p, _ := newFixturePlanner(t)
	facts := &Facts{Symbols: p.Symbols(), Text: p.view, Process: true}
	for _, tc := range []struct {
		point string
		off   uint64
		class string
		why   string // refused, mentioning it
	}{
		{point: "f", off: 0x00, class: "direct"},
		{point: "f+0x0", off: 0x00, class: "direct"},
		{point: "exc_int3", off: 0x00, class: "direct"},
		{point: "nifn+0x0", off: 0x00, class: "direct"},
		{point: "g+0x0", why: "an int3 is already there"},
		{point: "f+0x24", why: "padding between functions"},
	} {
		pt, err := ParsePoint(tc.point)
		if err != nil {
			t.Fatal(err)
		}
		sym, _, err := p.Symbols().Lookup(pt.Function)
		if err != nil {
			t.Fatal(err)
		}
		fn, err := cfg.ReadFunction(p.view, p.Symbols(), sym)
		if err != nil {
			t.Fatal(err)
		}
		s, err := facts.Func(fn, nil).Resolve(pt)
		if tc.why != "" {
			if !errors.Is(err, ErrNoSplice) || !strings.Contains(errString(err), tc.why) {
				t.Errorf("%s: %v, want a refusal mentioning %q", tc.point, err, tc.why)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.point, err)
			continue
		}
		if off := s.Addr() - s.Fn.Addr; off != tc.off || s.Class.String() != tc.class {
			t.Errorf("%s: +%#x %s, want +%#x %s", tc.point, off, s.Class, tc.off, tc.class)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestClass: the class of every spliceable instruction: direct from 5
// bytes; springboard while a slot is free in reach; else covering where
// the block allows a run (no landing, no symbol, no unresolved indirect
// jump, every instruction spliceable and all but the last falling
// through); else trap.
func TestClass(t *testing.T) {
	p, heap := newFixturePlanner(t)
	class := func(fn string, off uint64) string {
		t.Helper()
		f, _, err := p.Func(fn)
		if err != nil {
			t.Fatal(err)
		}
		i, err := f.Fn.Index(f.Fn.Addr + off)
		if err != nil {
			t.Fatal(err)
		}
		if why := f.Refusal(i); why != "" {
			return "refused: " + why
		}
		return f.Class(i).String()
	}
	for _, tc := range []struct {
		fn          string
		off         uint64
		free, taken string // with a slot free in reach, and with none
	}{
		{"f", 0x05, "covering", "covering"},    // push: 1 byte, runs over mov and test
		{"f", 0x06, "springboard", "covering"}, // mov: 3 bytes, runs over test
		{"f", 0x0c, "springboard", "trap"},     // je: its block ends with it
		{"f", 0x13, "springboard", "covering"},
		{"f", 0x15, "direct", "direct"},
		{"f", 0x1c, "springboard", "trap"}, // xor: the block ends after 2 bytes
		{"f", 0x1e, "trap", "trap"},        // pop: 1 byte, the block ends 1 byte later
		{"h", 0x00, "trap", "trap"},        // an unresolved jmp *%rax: no covering runs
		{"u", 0x2, "trap", "trap"},         // the run's next instruction is a fixup's landing
		{"u", 0x3, "springboard", "covering"},
		{"v", 0x00, "covering", "covering"},
	} {
		if got := class(tc.fn, tc.off); got != tc.free {
			t.Errorf("%s+%#x: %s, want %s", tc.fn, tc.off, got, tc.free)
		}
	}
	for a := uint64(base); a < base+uint64(len(text)); a++ { // every slot in reach of any of it
		for {
			if _, err := heap.Alloc(a); err != nil {
				break
			}
		}
	}
	for _, tc := range []struct {
		fn          string
		off         uint64
		free, taken string
	}{
		{"f", 0x05, "", "covering"}, {"f", 0x06, "", "covering"}, {"f", 0x0c, "", "trap"}, {"f", 0x13, "", "covering"},
		{"f", 0x1c, "", "trap"}, {"u", 0x3, "", "covering"},
	} {
		if got := class(tc.fn, tc.off); got != tc.taken {
			t.Errorf("no slot free: %s+%#x: %s, want %s", tc.fn, tc.off, got, tc.taken)
		}
	}
	// With the slots gone, the entry's cheapest is a covering splice:
	// the first one.
	if s, err := p.Resolve("f"); err != nil || s.Addr() != base+0x05 || s.Class != springboard.Cover ||
		len(s.Covered()) != 2 || s.Covered()[0].Addr() != base+0x06 || s.Covered()[1].Addr() != base+0x09 {
		t.Errorf("entry with no slot free: %+v, %v; want push covering mov and test", s, err)
	} else {
		// Detached keeps what the engine reads: the same instructions,
		// addresses, classes, liveness and name, and no more of f.
		d := s.Detached(nil)
		if d.Fn.Insns != nil || d.Where() != s.Where() || d.Class != s.Class || d.Live != s.Live ||
			!bytes.Equal(d.Insn().Bytes, s.Insn().Bytes) || !bytes.Equal(d.Bytes(), s.Insn().Bytes) || !bytes.Equal(s.Bytes(), s.Insn().Bytes) ||
			d.Insn().Inst.Op != s.Insn().Inst.Op || len(d.Covered()) != 2 {
			t.Fatalf("detached %+v, from %+v", d, s)
		}
		for i, c := range d.Covered() {
			if c.Addr() != s.Covered()[i].Addr() || c.Where() != s.Covered()[i].Where() || c.Live != s.Covered()[i].Live ||
				!bytes.Equal(c.Insn().Bytes, s.Covered()[i].Insn().Bytes) {
				t.Errorf("detached covered %d: %s %x, want %s %x", i, c.Where(), c.Insn().Bytes, s.Covered()[i].Where(), s.Covered()[i].Insn().Bytes)
			}
		}
	}
	if why := class("u", 0x0); !strings.Contains(why, "refused: ") || !strings.Contains(why, "ud2") {
		t.Errorf("ud2: %s, want refused by codegen", why)
	}
}

// TestSymbolInRun: a symbol starting after a short instruction is a way
// in: no covering run over it; from the symbol itself the run is fine.
func TestSymbolInRun(t *testing.T) {
	syms, err := kernel.ParseKallsyms(strings.NewReader("ffffffff81000080 t v\nffffffff81000081 t v_inner\n"))
	if err != nil {
		t.Fatal(err)
	}
	fn, err := cfg.Decode("v", "", base+0x80, text[0x80:0x88])
	if err != nil {
		t.Fatal(err)
	}
	f := (&Facts{Symbols: syms, Text: fixtureText()}).Func(fn, nil)
	if _, ok := f.CoverRun(0); ok {
		t.Error("a run over a symbol's start")
	}
	if n, ok := f.CoverRun(1); n != 2 || !ok {
		t.Errorf("from the symbol itself: %d, %v; want 2, true", n, ok)
	}
}

// TestCachedVerdicts: the census's cached codegen verdicts give the same
// answers as asking codegen each time.
func TestCachedVerdicts(t *testing.T) {
	p, _ := newFixturePlanner(t)
	k := p.Facts()
	v := NewVerdicts()
	for _, name := range []string{"f", "g", "h", "u", "v"} {
		sym, _, err := k.Symbols.Lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		fn, err := cfg.ReadFunction(k.Text, k.Symbols, sym)
		if err != nil {
			t.Fatal(err)
		}
		plain, cached := k.Func(fn, nil), k.Func(fn, v)
		for round := 0; round < 2; round++ { // the second from the cache
			for i := range fn.Insns {
				if a, b := plain.Refusal(i), cached.Refusal(i); a != b {
					t.Errorf("%s[%d]: refusal %q, cached %q", name, i, a, b)
				}
				a, okA := plain.CoverRun(i)
				b, okB := cached.CoverRun(i)
				if a != b || okA != okB {
					t.Errorf("%s[%d]: cover run %d %v, cached %d %v", name, i, a, okA, b, okB)
				}
			}
		}
	}
}

// TestLiveAtSite: a site carries what is live before it, and a covering
// site each covered instruction's own.
func TestLiveAtSite(t *testing.T) {
	p, _ := newFixturePlanner(t)
	s, err := p.Resolve("f+0x5")
	if err != nil {
		t.Fatal(err)
	}
	// je after test reads ZF: the flags are dead before test (it writes
	// them), so dead at push and mov too.
	if s.FlagsLive() || s.Covered()[0].FlagsLive() || s.Covered()[1].FlagsLive() {
		t.Errorf("flags live at %v / %v / %v", s.Live, s.Covered()[0].Live, s.Covered()[1].Live)
	}
	if got := p.Liveness(s); got != s.Live {
		t.Errorf("liveness alone %v, at resolve %v", got, s.Live)
	}
	je, err := p.Resolve("f+0xc")
	if err != nil || !je.FlagsLive() {
		t.Errorf("je: %v, flags live %v", err, je != nil && je.FlagsLive())
	}
}

// TestBlockOptionsAgree: the blocks every caller gets name call targets,
// end at calls to functions that never return, and read jump tables
// through the text the facts hold.
func TestBlockOptionsAgree(t *testing.T) {
	p, _ := newFixturePlanner(t)
	o := p.Facts().BlockOptions()
	if o.Names == nil || o.Tables == nil || o.NoReturn != nil {
		t.Errorf("before the analysis: %+v", o)
	}
	p.SetAnalysis(cfg.NoReturnSet{base + 0x30: true}, nil)
	o = p.Facts().BlockOptions()
	if o.NoReturn == nil || !o.NoReturn(base+0x30) || o.NoReturn(base) {
		t.Error("the no-return set is not in the block options")
	}
	if name, ok := o.Names(base + 0x40); !ok || name != "h" {
		t.Errorf("names: %q %v", name, ok)
	}
}
