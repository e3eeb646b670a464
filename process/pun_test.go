package process

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/engine"
	"github.com/kinst/kinst/splice"
	"github.com/kinst/kinst/springboard"
)

// TestPunCode: the bytes written over an instruction and where the jmp
// they start leads, against hand-assembled jumps.
func TestPunCode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		n, k   int
		x      uint32
		window []byte
		addr   uint64
		code   []byte
		target uint64
	}{
		// push %rbx; then 48 89 f8 89: jmp rel32 0x89f88948, backwards.
		{"1 byte", 1, 0, 0, []byte{0x48, 0x89, 0xf8, 0x89}, 0x555555555270,
			[]byte{0xe9}, 0x555555555275 - (0x100000000 - 0x89f88948)},
		// a 2-byte instruction: one free byte, the low one.
		{"2 bytes", 2, 0, 0xab, []byte{0x48, 0x01, 0xc8}, 0x7f0000001000,
			[]byte{0xe9, 0xab}, 0x7f0000001005 - (0x100000000 - 0xc80148ab)},
		// 4 bytes, three free: forwards by 0x31 << 24 | x.
		{"4 bytes", 4, 0, 0x123456, []byte{0x31}, 0x400000,
			[]byte{0xe9, 0x56, 0x34, 0x12}, 0x400005 + 0x31123456},
		// one padding prefix: the jmp is a byte longer, one free byte fewer.
		{"padded", 3, 1, 0x77, []byte{0x10, 0x20, 0x30}, 0x1000000,
			[]byte{pagePrefix, 0xe9, 0x77}, 0x1000006 + 0x30201077},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code := punCode(tc.n, tc.k, tc.x)
			if !bytes.Equal(code, tc.code) {
				t.Fatalf("punCode(%d, %d, %#x) = %x, want %x", tc.n, tc.k, tc.x, code, tc.code)
			}
			if got := punTarget(tc.addr, code, tc.window); got != tc.target {
				t.Errorf("target %#x, want %#x", got, tc.target)
			}
			p := &pun{addr: tc.addr, inst: make([]byte, tc.n), code: code}
			if lo, hi := p.window(); lo != tc.addr+uint64(tc.n) || hi != tc.addr+uint64(tc.k+5) || int(hi-lo) != len(tc.window) {
				t.Errorf("window [%#x, %#x), want %d bytes from %#x", lo, hi, len(tc.window), tc.addr+uint64(tc.n))
			}
		})
	}
}

// TestTrampoline: a jmp rel32 where the patch is in reach, else an
// indirect jmp through the quadword after it.
func TestTrampoline(t *testing.T) {
	if got := trampoline(0x1000, 0x2000); !bytes.Equal(got, []byte{0xe9, 0xfb, 0x0f, 0, 0}) {
		t.Errorf("near: %x", got)
	}
	far := trampoline(0x7f0000000000, 0x1000)
	want := []byte{0xff, 0x25, 0, 0, 0, 0, 0x00, 0x10, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(far, want) || len(far) > trampLen {
		t.Errorf("far: %x, want %x", far, want)
	}
}

// TestTrampSpace: where a trampoline may go -- not on the process's
// mappings, not over another trampoline, but at one already leading to
// the same patch -- and the candidates a window offers.
func TestTrampSpace(t *testing.T) {
	ts := trampSpace{pages: map[uint64]*trampPage{}, at: map[uint64]tramp{},
		busy: []span{{0x10000000, 0x10100000}, {0x20000000, 0x20001000}}}
	for _, tc := range []struct {
		at, patch uint64
		ok        bool
	}{
		{0x100, 1, false},            // below mmap_min_addr
		{0x10000800, 1, false},       // on a mapping
		{0x0ffffffc, 1, false},       // runs onto one
		{0x30000000, 1, true},        // free
		{highest - 4, 1, false},      // past the top
		{0x20001000 + 0x10, 1, true}, // just past a mapping
		{0x1ffffffd, 1, false},       // its last bytes on a mapping
		{0x30000000 + trampLen, 1, true},
	} {
		if got := ts.usable(tc.at, tc.patch); got != tc.ok {
			t.Errorf("usable(%#x) = %v, want %v", tc.at, got, tc.ok)
		}
	}
	if !ts.take(0x30000000, 7) || ts.take(0x30000000, 7) {
		t.Fatal("take: new the first time only")
	}
	if ts.usable(0x30000000, 8) || ts.usable(0x30000004, 8) {
		t.Error("a trampoline overlaps another's bytes")
	}
	if !ts.usable(0x30000000, 7) {
		t.Error("the trampoline to the same patch is not reusable")
	}
	if n := ts.newPages(0x30000000 + 32); n != 0 {
		t.Errorf("a trampoline in a page already kinst's maps %d new pages", n)
	}
	if n := ts.newPages(0x30000ffc); n != 1 {
		t.Errorf("a trampoline across into a new page maps %d, want 1", n)
	}
	// A retired trampoline is kept while a thread is on it, reclaimed
	// once none is.
	ts.take(0x30000100, 9)
	ts.retire([]uint64{0x30000100})
	on := map[int]*stopped{1: {}}
	on[1].regs.Rip = 0x30000100
	if n := ts.reclaim(on); n != 0 || ts.usable(0x30000100, 10) {
		t.Errorf("reclaimed %d with a thread on it; usable by another: %v", n, ts.usable(0x30000100, 10))
	}
	on[1].regs.Rip = 0x1000
	if n := ts.reclaim(on); n != 1 || !ts.usable(0x30000100, 10) {
		t.Errorf("reclaimed %d with no thread on it, want 1; usable: %v", n, ts.usable(0x30000100, 10))
	}
	// A 256-byte window over kinst's page: a free place in that page
	// comes before a new page.
	c := ts.candidates(0x30000000-0x40, 256)
	if !slices.Contains(c, uint64(0x30000010)) {
		t.Errorf("candidates %x: no free place in kinst's page", c)
	}
	// A window of one target has that one.
	if c := ts.candidates(0x40000000, 1); !slices.Equal(c, []uint64{0x40000000}) {
		t.Errorf("candidates of a 1-byte window: %x", c)
	}
	// A 16 MiB window starting on a mapping offers the mapping's end.
	if c := ts.candidates(0x10000000, 1<<24); !slices.Contains(c, uint64(0x10100000)) {
		t.Errorf("candidates %x: not the end of the mapping in the window", c)
	}
}

// TestPunnedSplices puts a punned jmp at every instruction of shorts()
// -- 1 to 4 bytes each, too short for a jmp rel32 -- with traps refused,
// while its threads check every result: every splice is a pun (no
// SIGTRAP handler goes in), each counts every call; removing and adding
// again the puns inside another's window (which move its target) keeps
// it counting; detaching restores every byte.
func TestPunnedSplices(t *testing.T) {
	w, want, calls, tg := startPuns(t)
	pid := w.cmd.Process.Pid
	entry, err := tg.Resolve("shorts")
	if err != nil {
		t.Fatal(err)
	}
	fn := entry.Fn
	orig := textOf(t, pid, fn)
	var sites []*splice.Site
	for _, in := range fn.Insns {
		if in.Len() >= springboard.JmpRel32Len {
			t.Fatalf("%s is %d bytes: shorts() should hold only short instructions", in.String(), in.Len())
		}
		s, err := tg.ResolveAs(fmt.Sprintf("shorts+%#x", in.Addr-fn.Addr), springboard.Trap)
		if err != nil {
			t.Fatal(err)
		}
		sites = append(sites, s)
		if strings.HasPrefix(in.String(), "ret") {
			break // the padding after it is not shorts'
		}
	}
	if len(sites) != 9 {
		t.Fatalf("shorts() has %d instructions, want 9", len(sites))
	}
	reqs, err := tg.Count("test", sites)
	if err != nil {
		t.Fatal(err)
	}
	for i, q := range reqs {
		if c := tg.Installed(q).Class; c != springboard.Pun {
			t.Errorf("%s (%d bytes): installed as %v, want punned", sites[i].Where(), len(sites[i].Bytes()), c)
		}
	}
	if catchesSIGTRAP(t, pid) {
		t.Error("punned splices only, and the process has a SIGTRAP handler")
	}
	// The planner's view of the text is the original instructions, each
	// whole, though every one of them has a jmp over it.
	r, err := tg.siteRegion(sites[0])
	if err != nil {
		t.Fatal(err)
	}
	seen := make([]byte, len(orig))
	if err := r.eng.Text().Read(fn.Addr, seen); err != nil || !bytes.Equal(seen, orig) {
		t.Errorf("the engine's text view with puns in: %x (%v), want the original %x", seen, err, orig)
	}
	if now := textOf(t, pid, fn); bytes.Equal(now, orig) {
		t.Error("the text with nine puns in reads as the original")
	}
	counts := func(round int, which []int) {
		t.Helper()
		for _, i := range which {
			if n := tg.Counter(reqs[i], 0); n != uint64(round)*calls {
				t.Errorf("round %d: %s (%d bytes) counted %d, want %d", round, sites[i].Where(), len(sites[i].Bytes()), n, uint64(round)*calls)
			}
		}
	}
	all := []int{0, 1, 2, 3, 4, 5, 6, 7, 8}
	if got := w.round(t); got != want {
		t.Errorf("output with the punned splices %q, without %q", got, want)
	}
	counts(1, all)
	// shorts+0x1 and +0x4 lie in the window of the push's jmp: out, a
	// round, in again.
	inWindow := []int{1, 2}
	if errs := tg.RemoveEach([]*engine.Request{reqs[1], reqs[2]}); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	if got := w.round(t); got != want {
		t.Errorf("output after removing two punned splices %q, want %q", got, want)
	}
	rest := []int{0, 3, 4, 5, 6, 7, 8}
	counts(2, rest)
	again, err := tg.Count("test", []*splice.Site{sites[1], sites[2]})
	if err != nil {
		t.Fatal(err)
	}
	reqs[1], reqs[2] = again[0], again[1]
	if got := w.round(t); got != want {
		t.Errorf("output after adding them again %q, want %q", got, want)
	}
	counts(3, rest)
	for _, i := range inWindow {
		if n := tg.Counter(reqs[i], 0); n != calls {
			t.Errorf("%s, added again: %d, want %d", sites[i].Where(), n, calls)
		}
	}
	if err := tg.Close(); err != nil {
		t.Fatal(err)
	}
	if now := textOf(t, pid, fn); !bytes.Equal(now, orig) {
		t.Errorf("after detach: %x, want %x", now, orig)
	}
	if got := w.round(t); got != want {
		t.Errorf("after detach: %q, want %q", got, want)
	}
}

// startPuns starts testdata/puns.c and attaches to it with traps
// refused: its output of a round, the calls of shorts() a round makes.
func startPuns(t *testing.T) (w *workload, want string, calls uint64, tg *Target) {
	t.Helper()
	needPtrace(t)
	w = start(t, compile(t, "gcc", "testdata/puns.c", "-pthread"))
	want = w.round(t)
	fmt.Sscanf(want, "calls %d", &calls)
	tg, err := Attach(w.cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tg.Close() })
	tg.NoTraps(TrapHazard)
	return w, want, calls, tg
}

// TestPunnedSplicesUnderLoad adds and removes the punned splices inside
// another's window again and again while the threads run shorts() and
// check each result: a thread between a pun and its trampoline, or on a
// trampoline whose pun moved, goes on to the right patch.
func TestPunnedSplicesUnderLoad(t *testing.T) {
	w, want, calls, tg := startPuns(t)
	var sites []*splice.Site
	for _, off := range []int{0, 1, 4} {
		s, err := tg.ResolveAs(fmt.Sprintf("shorts+%#x", off), springboard.Trap)
		if err != nil {
			t.Fatal(err)
		}
		sites = append(sites, s)
	}
	push, err := tg.Count("test", sites[:1])
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan string)
	go func() {
		var out []string
		for i := 0; i < 5; i++ {
			fmt.Fprintln(w.in, "go")
			l, err := w.out.ReadString('\n')
			if err != nil {
				out = append(out, err.Error())
				break
			}
			out = append(out, strings.TrimSpace(l))
		}
		done <- strings.Join(out, "\n")
	}()
	toggles := 0
	for running := true; running; {
		select {
		case got := <-done:
			running = false
			for _, l := range strings.Split(got, "\n") {
				if l != want {
					t.Errorf("a round under toggling said %q, want %q (a thread went astray)", l, want)
				}
			}
		default:
			reqs, err := tg.Count("test", sites[1:])
			if err != nil {
				t.Fatal(err)
			}
			if errs := tg.RemoveEach(reqs); errors.Join(errs...) != nil {
				t.Fatal(errors.Join(errs...))
			}
			toggles++
		}
	}
	if n := tg.Counter(push[0], 0); n != 5*calls {
		t.Errorf("the push's pun counted %d over five rounds, want %d", n, 5*calls)
	}
	t.Logf("%d add-and-remove rounds of two puns in a live pun's window", toggles)
}

// TestPunRefusedMove: a splice that would move a live pun's target onto
// memory that cannot hold a trampoline is refused, ErrPunned, and writes
// nothing.
func TestPunRefusedMove(t *testing.T) {
	d := &Device{puns: map[uint64]*pun{}, live: map[uint64]uint32{}, splices: map[uint32]*spliced{},
		tramps: trampSpace{pages: map[uint64]*trampPage{}, at: map[uint64]tramp{}}}
	// A 1-byte pun at 0x500000 whose window holds 00 00 00 00 now.
	p := &pun{addr: 0x500000, inst: []byte{0x53}, code: []byte{0xe9}, patch: 0x9000}
	d.puns[p.addr] = p
	v := &punView{d: d, changes: map[uint64]windowChange{}, cur: map[uint64]byte{}}
	v.set(0x500001, []byte{0, 0, 0, 0})
	// A write of 90 90 90 10 there: the target 0x10500005+... falls on
	// a mapping.
	d.tramps.busy = []span{{0x10000000, 0x20000000}}
	v.changes[0x500001] = windowChange{windowSplice: windowSplice{addr: 0x500001, orig: []byte{0, 0, 0, 0}, new: []byte{0x90, 0x90, 0x90, 0x10}}}
	v.set(0x500001, []byte{0x90, 0x90, 0x90, 0x10})
	err := v.ensure(p)
	if !errors.Is(err, ErrPunned) {
		t.Fatalf("ensure over a move onto a mapping: %v, want ErrPunned", err)
	}
	if len(d.tramps.at) != 0 {
		t.Errorf("a refused move reserved trampolines: %v", d.tramps.at)
	}
	// Onto free memory: both states (the write in, and out) get theirs.
	d.tramps.busy = nil
	if err := v.ensure(p); err != nil {
		t.Fatal(err)
	}
	if len(p.targets) != 2 {
		t.Errorf("targets %x, want one per state (2)", p.targets)
	}
}

// fakeText is a device over a sparse file standing in for a process's
// memory (/proc/PID/mem), with the text at addr, for planning alone.
func fakeText(t *testing.T, addr uint64, text []byte, busy []span) *Device {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "mem")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	// Whole 16-byte lines are read, as from a page of text.
	if _, err := f.WriteAt(append(slices.Clone(text), make([]byte, 32)...), int64(addr)); err != nil {
		t.Fatal(err)
	}
	return &Device{mem: &memFile{f: f}, punning: true, puns: map[uint64]*pun{}, live: map[uint64]uint32{}, splices: map[uint32]*spliced{},
		tramps: trampSpace{pages: map[uint64]*trampPage{}, at: map[uint64]tramp{}, busy: busy}}
}

// TestPunOverFallbackInt3: where a pun does not fit and an int3 stands
// in for it, a pun placed below in the same batch, whose window holds
// that byte, has a trampoline for the int3 in and for it out. (A pun
// planned over the instruction's own byte instead jumped into nothing
// once the int3 was written: ls -l died of SIGSEGV under cover --trap.)
func TestPunOverFallbackInt3(t *testing.T) {
	// 0x500000: push %rbx (53); 0x500001: ret (c3); then 00 00 40 00.
	// The ret's one target, 0x500006 + 0x00400000, is on a mapping; the
	// push's, about 0x40500000, are free.
	text := []byte{0x53, 0xc3, 0x00, 0x00, 0x40, 0x00}
	d := fakeText(t, 0x500000, text, []span{{0x400000, 0x1000000}})
	ops := []driver.SpliceOp{
		{Addr: 0x500000, Patch: 0x7000, Orig: text[:1], New: []byte{0xcc}, Inst: text[:1]},
		{Addr: 0x500001, Patch: 0x8000, Orig: text[1:2], New: []byte{0xcc}, Inst: text[1:2]},
	}
	puns := make([]*pun, 2)
	if refused, _ := d.plan(ops, nil, []int{0, 1}, puns, nil); len(refused) != 0 {
		t.Fatalf("refused %v with int3s allowed", refused)
	}
	if puns[1] != nil {
		t.Fatalf("the ret got a pun to %x, on a mapping", puns[1].targets)
	}
	p := puns[0]
	if p == nil {
		t.Fatal("no pun for the push")
	}
	withInt3 := punTarget(0x500000, p.code, []byte{0xcc, 0x00, 0x00, 0x40})
	without := punTarget(0x500000, p.code, []byte{0xc3, 0x00, 0x00, 0x40})
	if !slices.Contains(p.targets, withInt3) || !slices.Contains(p.targets, without) {
		t.Errorf("the push's trampolines %x, want %#x (the ret's int3 in) and %#x (out)", p.targets, withInt3, without)
	}
	// With int3s refused, the ret is refused and the push still placed.
	d = fakeText(t, 0x500000, text, []span{{0x400000, 0x1000000}})
	d.noInt3 = TrapHazard
	clear(puns)
	refused, _ := d.plan(ops, nil, []int{0, 1}, puns, nil)
	if len(refused) != 1 || refused[0].Index != 1 || puns[0] == nil {
		t.Fatalf("with int3s refused: refused %v, push's pun %v", refused, puns[0])
	}
	var npe *NoPunError
	if !errors.As(refused[0].Err, &npe) || npe.Len != 1 || !strings.Contains(npe.Error(), "1-byte instruction") {
		t.Errorf("refusal %v, want a NoPunError of the 1-byte ret", refused[0].Err)
	}
}

// TestPunPageMappedSinceRead: the process maps a page where a pun's
// trampoline was planned after kinst read its mappings (kept for
// busyTTL). Mapping kinst's pages fails (MAP_FIXED_NOREPLACE), the plan is
// undone and made again on the mappings read afresh, and every pun is in
// and counts; the process's page is left as it was.
func TestPunPageMappedSinceRead(t *testing.T) {
	w, want, calls, tg := startPuns(t)
	entry, err := tg.Resolve("shorts")
	if err != nil {
		t.Fatal(err)
	}
	// Instructions of 3 bytes or more: a 1-byte one's target is its
	// following bytes' alone, a 2-byte one's within 256 bytes of it (one
	// page, often), with no other to move to.
	var sites []*splice.Site
	for _, in := range entry.Fn.Insns {
		if strings.HasPrefix(in.String(), "ret") {
			break // the padding after it is not shorts'
		}
		if in.Len() < 3 {
			continue
		}
		s, err := tg.ResolveAs(fmt.Sprintf("shorts+%#x", in.Addr-entry.Fn.Addr), springboard.Trap)
		if err != nil {
			t.Fatal(err)
		}
		sites = append(sites, s)
	}
	var taken uint64
	plans := 0
	testBeforeMap = func(d *Device, st *stopped) {
		plans++
		if taken != 0 {
			return
		}
		// The process's read is made to look old, and a page the plan
		// wants is mapped by the process meanwhile.
		d.tramps.busyRead = time.Now().Add(-time.Hour)
		for pg, p := range d.tramps.pages {
			if !p.mapped {
				taken = pg
				break
			}
		}
		got, err := remoteSyscall(d.mem, st, unix.SYS_MMAP, taken, pageSize, unix.PROT_READ,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, ^uint64(0), 0)
		if err != nil || got != taken {
			t.Errorf("map %#x in the process: %#x, %v", taken, got, err)
		}
	}
	defer func() { testBeforeMap = nil }()
	reqs, err := tg.Count("test", sites)
	if err != nil {
		t.Fatal(err)
	}
	if taken == 0 || plans < 2 {
		t.Fatalf("planned %d times, page taken %#x: the retry was not exercised", plans, taken)
	}
	r, err := tg.siteRegion(sites[0])
	if err != nil {
		t.Fatal(err)
	}
	r.dev.punMu.Lock()
	_, ours := r.dev.tramps.pages[taken]
	for a := range r.dev.tramps.at {
		if a&^(pageSize-1) == taken {
			ours = true
		}
	}
	r.dev.punMu.Unlock()
	if ours {
		t.Errorf("the page the process mapped, %#x, holds kinst's trampolines", taken)
	}
	for i, q := range reqs {
		if c := tg.Installed(q).Class; c != springboard.Pun {
			t.Errorf("%s: installed as %v, want punned", sites[i].Where(), c)
		}
	}
	if got := w.round(t); got != want {
		t.Errorf("output with the punned splices %q, without %q", got, want)
	}
	for i, q := range reqs {
		if n := tg.Counter(q, 0); n != calls {
			t.Errorf("%s counted %d, want %d", sites[i].Where(), n, calls)
		}
	}
	page := make([]byte, pageSize)
	if err := r.dev.mem.read(taken, page); err != nil || !bytes.Equal(page, make([]byte, pageSize)) {
		t.Errorf("the process's page at %#x: %v, or not as it mapped it (zeros)", taken, err)
	}
}

// TestMmapLoop: mmapLoop's bytes are the instructions its comments say,
// by objdump, with the flags and system call number of this platform.
func TestMmapLoop(t *testing.T) {
	if got := binary.LittleEndian.Uint32(mmapLoop[0x18:]); got != unix.PROT_READ|unix.PROT_EXEC {
		t.Errorf("prot %#x", got)
	}
	if got := binary.LittleEndian.Uint32(mmapLoop[0x1e:]); got != unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE {
		t.Errorf("flags %#x", got)
	}
	if got := binary.LittleEndian.Uint32(mmapLoop[0x2d:]); got != unix.SYS_MMAP {
		t.Errorf("system call %d", got)
	}
	objdump, err := exec.LookPath("objdump")
	if err != nil {
		t.Skip("no objdump")
	}
	bin := filepath.Join(t.TempDir(), "loop.bin")
	if err := os.WriteFile(bin, mmapLoop, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(objdump, "-D", "-b", "binary", "-mi386:x86-64", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Split(line, "\t"); len(f) == 3 && strings.HasSuffix(f[0], ":") {
			got = append(got, strings.Join(strings.Fields(f[2]), " "))
		}
	}
	want := []string{
		"mov %rdi,%r12", "mov %rsi,%r13", "xor %r14d,%r14d",
		"cmp %r13,%r14", "jae 0x42",
		"mov (%r12),%rdi", "mov 0x8(%r12),%rsi", "mov $0x5,%edx", "mov $0x100022,%r10d",
		"mov $0xffffffffffffffff,%r8", "xor %r9d,%r9d", "mov $0x9,%eax", "syscall",
		"cmp (%r12),%rax", "jne 0x42", "add $0x10,%r12", "inc %r14", "jmp 0x9",
		"int3",
	}
	if !slices.Equal(got, want) {
		t.Errorf("objdump:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestPunKeepsLivePuns: a new pun whose bytes lie in a live pun's window
// chooses its free bytes so that the live pun's target, which they set
// too, stays on memory that can hold a trampoline. The choice best for
// the new pun alone (its target on the first free page) would move the
// live one onto a mapping, and the write was refused (ErrPunned).
func TestPunKeepsLivePuns(t *testing.T) {
	// 0x500000: a live 1-byte pun (e9) over push %rbx; 0x500001: nopl
	// 0x0(%rax) (0f 1f 40 00), 4 bytes, to be punned; then zeros.
	text := []byte{0xe9, 0x0f, 0x1f, 0x40, 0x00}
	busy := []span{{0x400000, 0x600000}, {0x700000, 0x800000}, {0x10000000, 0x20000000}}
	d := fakeText(t, 0x500000, text, busy)
	d.noInt3 = TrapHazard
	live := &pun{addr: 0x500000, inst: []byte{0x53}, code: []byte{0xe9}, patch: 0x9000}
	d.puns[live.addr] = live
	ops := []driver.SpliceOp{{Addr: 0x500001, Patch: 0x7000, Orig: text[1:5], New: []byte{0xcc}, Inst: text[1:5]}}
	// The new pun's first choice, its target at 0x600000, gives it the
	// code e9 fa ff 0f and the live one the target 0x500005+0x0ffffae9,
	// inside the mapping at 0x10000000.
	if got := punTarget(live.addr, live.code, []byte{0xe9, 0xfa, 0xff, 0x0f}); got < 0x10000000 || got >= 0x20000000 {
		t.Fatalf("the set-up is off: the first choice moves the live pun to %#x", got)
	}
	puns := make([]*pun, 1)
	if refused, _ := d.plan(ops, nil, []int{0}, puns, nil); len(refused) != 0 {
		t.Fatalf("refused: %v", refused[0])
	}
	p := puns[0]
	if p == nil {
		t.Fatal("no pun for the nopl")
	}
	for _, tg := range live.targets {
		if d.tramps.isBusy(tg&^(pageSize-1), tg&^(pageSize-1)+pageSize) {
			t.Errorf("the live pun's target %#x is on a mapping", tg)
		}
	}
	if in := punTarget(live.addr, live.code, p.code[:4]); !slices.Contains(live.targets, in) {
		t.Errorf("the live pun's targets %x lack %#x, its target with the new pun in", live.targets, in)
	}
}
