package process

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/driver"
)

// Punned jumps (E9Patch, Duck et al., PLDI 2020). Where an instruction is
// too short for a jmp rel32 and the engine asks for a trap splice, the
// device writes a jmp rel32 over it whose last bytes are the bytes of the
// instructions after it, left as they are: the rel32 bytes that fall
// within the instruction (after any padding prefixes, the free bytes)
// choose among the targets the following bytes allow, and a trampoline
// there, in a page kinst maps into the process, jumps on to the patch.
// Nothing after the instruction changes, so code that reaches the next
// instruction by any other path runs it as before; a hit costs two jumps
// more than a direct splice, not a signal.
//
// The target depends on bytes the pun does not own: the window, from the
// instruction's end to the jmp's. Other splices may cover them (a
// springboard's jmp rel8 at the next block, a slot in the padding after a
// ret). Every state the window can take while the pun is in -- each
// splice over it in or out -- has its trampoline written before that
// state can exist: a splice whose writing would move a pun onto memory
// that cannot hold a trampoline is refused (ErrPunned), and removing one
// finds the trampoline of the state it leaves already there. Trampolines
// are never rewritten to lead elsewhere (but on Resplice, to the pun's
// new patch), nor reused: a thread stopped on one goes where it went.

// ErrPunned refuses a splice that would move a punned jump's target onto
// memory that cannot hold a trampoline.
var ErrPunned = errors.New("the bytes are part of a punned jump")

// errNoPun: no padding and free bytes of a punned jump land every state
// of its window on memory that can hold a trampoline.
var errNoPun = errors.New("no punned jmp fits: every target its following bytes allow is mapped memory")

const (
	pagePrefix = 0x26 // an ES segment override: ignored by a near jmp in 64-bit mode
	trampLen   = 14   // the longest trampoline: jmp [rip]; .quad patch
	pageSize   = 4096
	maxStates  = 8 // window states a pun may have (three splices over its window)
)

// pun is a punned jump the device wrote.
type pun struct {
	addr    uint64
	inst    []byte // the instruction it replaced
	code    []byte // what it wrote over inst: prefixes, e9, the free rel32 bytes
	patch   uint64
	targets []uint64 // its trampolines, one per window state seen
}

// window is the bytes the jmp reads past the instruction.
func (p *pun) window() (lo, hi uint64) {
	k := punPadding(p.code)
	return p.addr + uint64(len(p.code)), p.addr + uint64(k+5)
}

func punPadding(code []byte) int {
	k := 0
	for k < len(code) && code[k] == pagePrefix {
		k++
	}
	return k
}

// punCode is the n bytes written over an n-byte instruction: k padding
// prefixes, the jmp opcode and the low n-1-k bytes of the rel32, x.
func punCode(n, k int, x uint32) []byte {
	code := make([]byte, n)
	for i := 0; i < k; i++ {
		code[i] = pagePrefix
	}
	code[k] = 0xe9
	for i := k + 1; i < n; i++ {
		code[i] = byte(x >> (8 * (i - k - 1)))
	}
	return code
}

// punTarget is where the jmp of code at addr, followed by window bytes w
// (len(code)+len(w) is its length), leads.
func punTarget(addr uint64, code, w []byte) uint64 {
	k := punPadding(code)
	var rel [4]byte
	n := copy(rel[:], code[k+1:])
	copy(rel[n:], w)
	return addr + uint64(k+5) + uint64(int64(int32(binary.LittleEndian.Uint32(rel[:]))))
}

// trampoline is the jump at a pun's target to its patch: a jmp rel32
// where the patch is within reach, else an indirect jmp through the
// quadword after it.
func trampoline(at, patch uint64) []byte {
	if rel := int64(patch) - int64(at+5); rel == int64(int32(rel)) {
		b := []byte{0xe9, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[1:], uint32(int32(rel)))
		return b
	}
	b := []byte{0xff, 0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	binary.LittleEndian.PutUint64(b[6:], patch)
	return b
}

// span is [lo, hi) of the process's address space.
type span struct{ lo, hi uint64 }

// Where trampolines may go: user space above mmap_min_addr's default,
// below the top page.
const lowest, highest = 1 << 16, 1<<47 - 1<<12

// Room left for the growth of the stack (down) and of the brk heap (up),
// which a page of kinst's there would stop: the stack's is its usual
// limit many times over; past the heap's, glibc's malloc goes on with
// mmap where brk fails.
const stackRoom, heapRoom = 256 << 20, 32 << 20

// busySpans is what the process has mapped, from /proc/PID/maps, with
// room left for its stack and brk heap to grow, sorted.
func busySpans(pid int) ([]span, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoProcess, err)
	}
	defer f.Close()
	var used []span
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if len(fs) >= 6 {
			switch fs[5] {
			case "[stack]":
				a = max(a, stackRoom+lowest) - stackRoom
			case "[heap]":
				b += heapRoom
			}
		}
		used = append(used, span{a, b})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	// The brk heap before its first page: start_brk, /proc/PID/stat's
	// 47th field.
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			if fs := strings.Fields(s[i+1:]); len(fs) > 44 {
				if brk, err := strconv.ParseUint(fs[44], 10, 64); err == nil && brk != 0 {
					used = append(used, span{brk, brk + heapRoom})
				}
			}
		}
	}
	slices.SortFunc(used, func(x, y span) int {
		if x.lo != y.lo {
			if x.lo < y.lo {
				return -1
			}
			return 1
		}
		return 0
	})
	return used, nil
}

// trampPage is a page of trampolines kinst mapped into the process.
type trampPage struct {
	used   [pageSize / 64]uint64 // a bit per byte taken
	mapped bool                  // false until the write that needs it maps it
}

func (p *trampPage) free(off, n int) bool {
	for i := off; i < off+n; i++ {
		if p.used[i/64]&(1<<(i%64)) != 0 {
			return false
		}
	}
	return true
}

func (p *trampPage) mark(off, n int, used bool) {
	for i := off; i < off+n; i++ {
		if used {
			p.used[i/64] |= 1 << (i % 64)
		} else {
			p.used[i/64] &^= 1 << (i % 64)
		}
	}
}

// tramp is a trampoline written (or reserved) at an address.
type tramp struct {
	patch   uint64
	n       int  // its bytes
	retired bool // its pun is gone: reclaimed once no thread is on it
}

// trampSpace is the device's trampoline pages and, during a write, the
// process's other mappings. Protected by Device.punMu.
type trampSpace struct {
	pages map[uint64]*trampPage
	at    map[uint64]tramp // every trampoline, by address
	// busy is the process's mappings (busySpans), read by the first
	// question of a write that needs them (a removal's seldom does):
	// loadBusy, when set, reads them.
	busy     []span
	busyRead time.Time // when busy was read; zero: to be read
	loadBusy func() ([]span, error)
}

func (ts *trampSpace) inPages(pc uint64) bool {
	_, ok := ts.pages[pc&^(pageSize-1)]
	return ok
}

// isBusy: [lo, hi) meets a mapping of the process's (or they cannot
// be read).
func (ts *trampSpace) isBusy(lo, hi uint64) bool {
	ts.load()
	i := sort.Search(len(ts.busy), func(i int) bool { return ts.busy[i].hi > lo })
	return i < len(ts.busy) && ts.busy[i].lo < hi
}

// fits: the n bytes at t are free in kinst's pages or on pages the
// process has not mapped.
func (ts *trampSpace) fits(t uint64, n int) bool {
	if t < lowest || t+uint64(n) > highest {
		return false
	}
	end := t + uint64(n)
	for a := t; a < end; {
		pg := a &^ (pageSize - 1)
		e := min(end, pg+pageSize)
		if p, ok := ts.pages[pg]; ok {
			if !p.free(int(a-pg), int(e-a)) {
				return false
			}
		} else if ts.isBusy(pg, pg+pageSize) {
			return false
		}
		a = e
	}
	return true
}

// mark takes (or frees) the n bytes at t, entering new pages unmapped.
func (ts *trampSpace) mark(t uint64, n int, used bool) {
	end := t + uint64(n)
	for a := t; a < end; {
		pg := a &^ (pageSize - 1)
		e := min(end, pg+pageSize)
		p := ts.pages[pg]
		if p == nil {
			p = &trampPage{}
			ts.pages[pg] = p
		}
		p.mark(int(a-pg), int(e-a), used)
		a = e
	}
}

// usable: a trampoline to patch may go at t, or a live one already leads
// there.
func (ts *trampSpace) usable(t, patch uint64) bool {
	if tr, ok := ts.at[t]; ok {
		return tr.patch == patch && !tr.retired
	}
	return ts.fits(t, len(trampoline(t, patch)))
}

// newPages is how many pages a trampoline at t would map.
func (ts *trampSpace) newPages(t uint64) int {
	if _, ok := ts.at[t]; ok {
		return 0
	}
	n := 0
	for pg := t &^ (pageSize - 1); pg < t+5; pg += pageSize {
		if _, ok := ts.pages[pg]; !ok {
			n++
		}
	}
	return n
}

// take reserves a trampoline to patch at t (usable); it reports whether
// it is new.
func (ts *trampSpace) take(t, patch uint64) bool {
	if _, ok := ts.at[t]; ok {
		return false
	}
	n := len(trampoline(t, patch))
	ts.mark(t, n, true)
	ts.at[t] = tramp{patch: patch, n: n}
	return true
}

// retire marks the trampolines at ts as their pun's no longer.
func (ts *trampSpace) retire(targets []uint64) {
	for _, t := range targets {
		if tr, ok := ts.at[t]; ok {
			tr.retired = true
			ts.at[t] = tr
		}
	}
}

// reclaim frees the retired trampolines no stopped thread is on (the
// caller holds every thread stopped: none can reach one again, their
// puns being gone), and says how many. Only when a pun finds no room
// otherwise: like a freed patch, a retired trampoline may still be where
// a signal handler returns to (the pc on the thread's stack, which kinst
// does not read), so it is kept as long as it can be.
func (ts *trampSpace) reclaim(held map[int]*stopped) (n int) {
	for t, tr := range ts.at {
		if !tr.retired {
			continue
		}
		on := false
		for _, st := range held {
			if pc := st.regs.Rip; pc >= t && pc < t+uint64(tr.n) {
				on = true
			}
		}
		if !on {
			ts.mark(t, tr.n, false)
			delete(ts.at, t)
			n++
		}
	}
	return n
}

// load reads the process's mappings when those read are older than
// busyTTL.
func (ts *trampSpace) load() {
	if ts.loadBusy == nil || !ts.busyRead.IsZero() && time.Since(ts.busyRead) < busyTTL {
		return
	}
	busy, err := ts.loadBusy()
	ts.busyRead = time.Now()
	if err != nil {
		busy = []span{{0, 1<<64 - 1}} // nothing new is placed
	}
	ts.busy = busy
}

// busyTTL is how long the process's mappings, once read, are used
// without reading them again. Reading them was a tenth of arming libc's
// puns (/proc/PID/maps grows with kinst's own pages, one read a batch);
// a page the process has mapped since is found as mmap refuses it
// (EEXIST), and that write is planned again with them read afresh.
const busyTTL = time.Second

// reload reads the mappings again and says whether they changed.
func (ts *trampSpace) reload() bool {
	busy, err := ts.loadBusy()
	if err != nil {
		return false
	}
	ts.busyRead = time.Now()
	changed := !slices.Equal(ts.others(busy), ts.others(ts.busy))
	ts.busy = busy
	return changed
}

// others are the spans of busy that are not kinst's trampoline pages.
func (ts *trampSpace) others(busy []span) []span {
	var out []span
	for _, s := range busy {
		ours := true
		for pg := s.lo; pg < s.hi && ours; pg += pageSize {
			p, ok := ts.pages[pg]
			ours = ok && p.mapped
		}
		if !ours {
			out = append(out, s)
		}
	}
	return out
}

// readBefore: the mappings used were read before t (and not since), so a
// plan that failed on them may not fail on fresh ones.
func (ts *trampSpace) readBefore(t time.Time) bool {
	return ts.loadBusy != nil && !ts.busyRead.IsZero() && ts.busyRead.Before(t)
}

// candidates are targets to try in [lo, lo+n) for a trampoline: the
// first, free places in kinst's pages there, and the first free page.
func (ts *trampSpace) candidates(lo, n uint64) []uint64 {
	out := []uint64{lo}
	if n == 1 {
		return out
	}
	hi := lo + n
	// kinst's pages in range: their first free place.
	for pg := lo &^ (pageSize - 1); pg < hi && len(out) < 64; pg += pageSize {
		p, ok := ts.pages[pg]
		if !ok {
			if pg >= lo && !ts.isBusy(pg, pg+pageSize) {
				out = append(out, pg)
				break // the first free page in range; kinst's own come first below
			}
			if n > 16*pageSize {
				break // a wide window: the rest is found by its gaps
			}
			continue
		}
		for off := uint64(0); off+trampLen <= pageSize; off += 16 {
			if t := pg + off; t >= lo && t < hi && p.free(int(off), 5) {
				out = append(out, t)
				break
			}
		}
	}
	// A wide window (16 MiB): the end of each mapping in it.
	if n > 16*pageSize {
		ts.load()
		i := sort.Search(len(ts.busy), func(i int) bool { return ts.busy[i].hi > lo })
		for ; i < len(ts.busy) && ts.busy[i].hi < hi && len(out) < 64; i++ {
			out = append(out, (ts.busy[i].hi+pageSize-1)&^(pageSize-1))
		}
	}
	return out
}

// mapPages maps the trampoline pages not yet mapped (runs of adjacent
// pages as one mapping), with thread st running mmapLoop over a table of
// them in the patch region; the caller holds every thread stopped. An
// error that wraps unix.EEXIST: the process has mapped one of the pages
// since its mappings were read (those before it are mapped).
func (d *Device) mapPages(st *stopped) error {
	var want []uint64
	for pg, p := range d.tramps.pages {
		if !p.mapped {
			want = append(want, pg)
		}
	}
	if len(want) == 0 {
		return nil
	}
	slices.Sort(want)
	var runs []span
	for i := 0; i < len(want); {
		j := i + 1
		for j < len(want) && want[j] == want[j-1]+pageSize {
			j++
		}
		runs = append(runs, span{want[i], want[j-1] + pageSize})
		i = j
	}
	code, table, err := d.mmapLoop()
	if err != nil {
		return err
	}
	for len(runs) > 0 {
		n := min(len(runs), mmapTable)
		for i, r := range runs[:n] {
			binary.LittleEndian.PutUint64(d.local[table-d.base+16*uint64(i):], r.lo)
			binary.LittleEndian.PutUint64(d.local[table-d.base+16*uint64(i)+8:], r.hi-r.lo)
		}
		out, err := runCode(st, code, code+uint64(len(mmapLoop))-1, table, uint64(n))
		if err != nil {
			return fmt.Errorf("map trampoline pages into process %d: %w", d.pid, err)
		}
		done := int(min(out.R14, uint64(n)))
		for _, r := range runs[:done] {
			for pg := r.lo; pg < r.hi; pg += pageSize {
				d.tramps.pages[pg].mapped = true
			}
		}
		if done < n {
			r := runs[done]
			if got := out.Rax; int64(got) < 0 && int64(got) > -4096 {
				err = unix.Errno(-int64(got))
			} else {
				remoteSyscall(d.mem, st, unix.SYS_MUNMAP, got, r.hi-r.lo)
				err = fmt.Errorf("mapped at %#x, not %#x", got, r.lo)
			}
			return fmt.Errorf("map trampoline pages at %#x into process %d: %w%s", r.lo, d.pid, err, seccompNote(d.pid))
		}
		runs = runs[n:]
	}
	return nil
}

// mmapTable is how many runs of pages one run of mmapLoop maps; its
// table follows the code, mmapLoopRoom bytes in.
const mmapTable, mmapLoopRoom = 255, 128

// mmapLoop is where mmapLoop's code and table are in the patch region,
// written the first time it is asked for.
func (d *Device) mmapLoop() (code, table uint64, err error) {
	if d.loopAt != 0 {
		return d.loopAt, d.loopAt + mmapLoopRoom, nil
	}
	d.mu.Lock()
	a, err := d.heap.Alloc(mmapLoopRoom + 16*mmapTable)
	d.mu.Unlock()
	if err != nil {
		return 0, 0, fmt.Errorf("room for kinst's mmap loop in the patch region: %w", err)
	}
	copy(d.local[a-d.base:], mmapLoop)
	d.loopAt = a
	return a, a + mmapLoopRoom, nil
}

// windowSplice is a splice over a pun's window, whose being in or out
// changes the pun's target: orig is the text without it.
type windowSplice struct {
	addr      uint64
	orig, new []byte
}

// windowChange is a write of the batch being planned: the splice at
// addr goes in (or changes, Resplice) or, gone, out.
type windowChange struct {
	windowSplice
	gone bool
}

// maxSpliceLen is the most bytes a splice writes (a jmp rel32): how far
// before a window a splice over it may start.
const maxSpliceLen = 5

// punView is the text as a write will leave it, for planning puns and
// their windows' states. Its user holds Device.punMu.
type punView struct {
	d       *Device
	held    map[int]*stopped        // the stopped threads (nil in tests): whose pcs reclaim reads
	changes map[uint64]windowChange // the write's, by address
	cur     map[uint64]byte         // text bytes read, with the write's applied
}

// spliceAt is the splice at a after the write, if one is.
func (v *punView) spliceAt(a uint64) (windowSplice, bool) {
	if c, ok := v.changes[a]; ok {
		return c.windowSplice, !c.gone
	}
	if id, ok := v.d.live[a]; ok {
		s := v.d.splices[id]
		return windowSplice{addr: s.addr, orig: s.orig, new: s.new}, true
	}
	return windowSplice{}, false
}

// byteAt is the text at a after the write.
func (v *punView) byteAt(a uint64) (byte, error) {
	if b, ok := v.cur[a]; ok {
		return b, nil
	}
	var buf [16]byte
	lo := a &^ 15
	if err := v.d.mem.read(lo, buf[:]); err != nil {
		return 0, err
	}
	for i, b := range buf {
		if _, ok := v.cur[lo+uint64(i)]; !ok {
			v.cur[lo+uint64(i)] = b
		}
	}
	return v.cur[a], nil
}

// set records bytes the write leaves at a.
func (v *punView) set(a uint64, b []byte) {
	for i, c := range b {
		v.cur[a+uint64(i)] = c
	}
}

// states lists the contents window [lo, hi) may take while the splices
// over it go in and out, the current one first.
func (v *punView) states(lo, hi uint64) ([][]byte, error) {
	w := make([]byte, hi-lo)
	for i := range w {
		b, err := v.byteAt(lo + uint64(i))
		if err != nil {
			return nil, err
		}
		w[i] = b
	}
	var over []windowSplice
	for a := lo - maxSpliceLen + 1; a < hi; a++ {
		if s, ok := v.spliceAt(a); ok && a+uint64(len(s.new)) > lo {
			over = append(over, s)
		}
	}
	if 1<<len(over) > maxStates {
		return nil, fmt.Errorf("%d splices over the bytes a punned jump would read", len(over))
	}
	out := [][]byte{w}
	for mask := 1; mask < 1<<len(over); mask++ {
		c := slices.Clone(w)
		for j, s := range over {
			if mask&(1<<j) == 0 {
				continue
			}
			for i, b := range s.orig {
				if a := s.addr + uint64(i); a >= lo && a < hi {
					c[a-lo] = b
				}
			}
		}
		out = append(out, c)
	}
	return out, nil
}

// place chooses the code of a new pun over inst at addr leading to
// patch: the padding and free bytes whose targets, in every state of its
// window, can hold a trampoline, fewest new pages first; and takes them.
// Where accept is not nil, a choice it refuses is passed over, unless
// every choice is.
func (v *punView) place(addr uint64, inst []byte, patch uint64, accept func(code []byte) bool) (*pun, error) {
	p, err := v.placeOnce(addr, inst, patch, accept)
	if err != nil && v.held != nil && v.d.tramps.reclaim(v.held) > 0 {
		return v.placeOnce(addr, inst, patch, accept) // with the retired ones' room
	}
	return p, err
}

// placeOnce is place without reclaiming retired trampolines.
func (v *punView) placeOnce(addr uint64, inst []byte, patch uint64, accept func(code []byte) bool) (*pun, error) {
	c, err := v.choose(addr, inst, patch, accept)
	if err != nil && accept != nil {
		c, err = v.choose(addr, inst, patch, nil)
	}
	if err != nil {
		return nil, err
	}
	p := &pun{addr: addr, inst: slices.Clone(inst), code: c.code, patch: patch}
	for _, t := range c.targets {
		v.reserve(p, t)
	}
	return p, nil
}

// punChoice is a pun's code and its trampolines' places, one per state of
// its window.
type punChoice struct {
	code    []byte
	targets []uint64
}

// choose finds place's choice without taking it.
func (v *punView) choose(addr uint64, inst []byte, patch uint64, accept func(code []byte) bool) (punChoice, error) {
	n := len(inst)
	var lastErr error = errNoPun
	for k := 0; k < n; k++ {
		free := n - 1 - k
		lo, hi := addr+uint64(n), addr+uint64(k+5)
		states, err := v.states(lo, hi)
		if err != nil {
			lastErr = err
			continue
		}
		zero := punCode(n, k, 0)
		bases := make([]uint64, len(states))
		for i, w := range states {
			bases[i] = punTarget(addr, zero, w)
		}
		span := uint64(1) << (8 * free)
		// The free bytes each state's window offers, every state's
		// targets checked for each.
		var xs []uint64
		for _, b := range bases {
			for _, c := range v.d.tramps.candidates(b, span) {
				if x := c - b; !slices.Contains(xs, x) {
					xs = append(xs, x)
				}
			}
		}
		best, bestPages := uint64(0), -1
		for _, x := range xs {
			pages, ok := 0, true
			for _, b := range bases {
				t := b + x
				if !v.d.tramps.usable(t, patch) {
					ok = false
					break
				}
				pages += v.d.tramps.newPages(t)
			}
			better := bestPages < 0 || pages < bestPages
			code := punCode(n, k, uint32(x))
			ok = ok && better && v.keepsLive(addr, inst, code, patch, bases, x) && (accept == nil || accept(code))
			if ok {
				best, bestPages = x, pages
				if pages == 0 {
					break
				}
			}
		}
		if bestPages < 0 {
			continue
		}
		c := punChoice{code: punCode(n, k, uint32(best))}
		for _, b := range bases {
			c.targets = append(c.targets, b+best)
		}
		return c, nil
	}
	return punChoice{}, lastErr
}

// with returns f's answer with code written over inst at addr in the
// view, and puts the view back after.
func (v *punView) with(addr uint64, inst, code []byte, f func() bool) bool {
	prev, had := v.changes[addr]
	saved := make([]struct {
		b  byte
		ok bool
	}, len(code))
	for i := range code {
		saved[i].b, saved[i].ok = v.cur[addr+uint64(i)]
	}
	v.changes[addr] = windowChange{windowSplice: windowSplice{addr: addr, orig: inst, new: code}}
	v.set(addr, code)
	defer func() {
		if had {
			v.changes[addr] = prev
		} else {
			delete(v.changes, addr)
		}
		for i, c := range saved {
			if c.ok {
				v.cur[addr+uint64(i)] = c.b
			} else {
				delete(v.cur, addr+uint64(i))
			}
		}
	}()
	return f()
}

// keepsLive: with a new pun's code at addr (over inst, leading to patch
// through trampolines at each of bases+x), every live pun whose window
// holds its bytes still lands, in each state its window may take, on
// memory that can hold its trampoline, clear of the new pun's own. The
// new pun's bytes choose those live puns' targets too: without this, a
// choice good for it alone could leave one of them nowhere to go, and the
// splice was refused (ErrPunned) where another choice was fine.
func (v *punView) keepsLive(addr uint64, inst, code []byte, patch uint64, bases []uint64, x uint64) bool {
	over := v.d.punsOver(addr, len(code))
	if len(over) == 0 {
		return true
	}
	// The view with the new pun in, for the question.
	return v.with(addr, inst, code, func() bool {
		for _, p := range over {
			if c, found := v.changes[p.addr]; found && c.gone {
				continue // out with this write
			}
			lo, hi := p.window()
			states, err := v.states(lo, hi)
			if err != nil {
				return false
			}
			for _, w := range states {
				t := punTarget(p.addr, p.code, w)
				if !v.d.tramps.usable(t, p.patch) {
					return false
				}
				m := uint64(len(trampoline(t, p.patch)))
				for _, b := range bases {
					mine := b + x
					n := uint64(len(trampoline(mine, patch)))
					if t < mine+n && mine < t+m && !(t == mine && p.patch == patch) {
						return false
					}
				}
			}
		}
		return true
	})
}

// reserve takes a trampoline at t for p (new ones are written by the
// write, after mapPages).
func (v *punView) reserve(p *pun, t uint64) {
	if v.d.tramps.take(t, p.patch) {
		v.d.trampsNew = append(v.d.trampsNew, t)
	}
	if !slices.Contains(p.targets, t) {
		p.targets = append(p.targets, t)
	}
}

// ensure gives live pun p a trampoline in every state its window may take
// after the write, or says it cannot.
func (v *punView) ensure(p *pun) error {
	lo, hi := p.window()
	states, err := v.states(lo, hi)
	if err != nil {
		return err
	}
	ts := make([]uint64, len(states))
	for i, w := range states {
		ts[i] = punTarget(p.addr, p.code, w)
		if !v.d.tramps.usable(ts[i], p.patch) {
			return fmt.Errorf("%w at %#x: its target would move to %#x, which cannot hold a trampoline", ErrPunned, p.addr, ts[i])
		}
	}
	for _, t := range ts {
		v.reserve(p, t)
	}
	return nil
}

// planPuns plans a write with every thread stopped: it places a punned
// jmp for each trap op of ops (by its Inst) where punning is on, highest
// address first (a pun's window may hold the next one's bytes), and
// gives every live pun whose window the write (ops, and changes: removals
// and Resplice's) touches a trampoline in each state its window may then
// take; then maps the new trampoline pages and writes the trampolines.
// puns[i] is op i's pun, nil where none was asked or none fits (an int3
// then, unless noInt3 refuses it: the *driver.BatchError names those ops).
func (d *Device) planPuns(ops []driver.SpliceOp, changes []windowChange) (puns []*pun, err error) {
	puns = make([]*pun, len(ops))
	var want []int
	for i, op := range ops {
		if d.punning && len(op.New) == 1 && op.New[0] == 0xcc && len(op.Inst) > 0 && len(op.Inst) < 5 {
			want = append(want, i)
		}
	}
	if len(want) == 0 && !d.touchesPuns(ops, changes) {
		return puns, nil
	}
	if err := d.region(); err != nil {
		return nil, err
	}
	var refused []*driver.BatchError
	err = d.withStopped(func(held map[int]*stopped) error {
		d.tramps.loadBusy = func() ([]span, error) { return busySpans(d.pid) }
		// Planned again at most once, in this stop, where the mappings
		// used turn out out of date: with every thread stopped the fresh
		// ones stay true until the write is done. (Replanning after a
		// resume, in a process that maps and unmaps all the time, found
		// them changed again every time and armed nothing.)
		for again := false; ; again = true {
			clear(puns)
			t0 := time.Now()
			var missed int
			refused, missed = d.plan(ops, changes, want, puns, held)
			if missed > 0 && !again && d.tramps.readBefore(t0) && d.tramps.reload() {
				// A pun found no room on mappings read before this
				// write, and they have changed since.
				d.unplan()
				continue
			}
			if testBeforeMap != nil {
				testBeforeMap(d, anyThread(held))
			}
			err := d.mapPages(anyThread(held))
			if err != nil && errors.Is(err, unix.EEXIST) && !again && d.tramps.readBefore(t0) {
				// The process mapped one of the pages since they were read.
				d.unplan()
				d.tramps.reload()
				continue
			}
			if err != nil {
				return err
			}
			break
		}
		for _, t := range d.trampsNew {
			if err := d.mem.write(t, trampoline(t, d.tramps.at[t].patch)); err != nil {
				return err
			}
		}
		d.trampsNew = d.trampsNew[:0]
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(refused) > 0 {
		slices.SortFunc(refused, func(a, b *driver.BatchError) int { return a.Index - b.Index })
		first := refused[0]
		first.Also = refused[1:]
		return nil, first
	}
	return puns, nil
}

func cmpAddr(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// opIndex is the index of the op at addr, or -1 (a removal's).
func opIndex(ops []driver.SpliceOp, addr uint64) int {
	for i, op := range ops {
		if op.Addr == addr {
			return i
		}
	}
	return -1
}

// testBeforeMap, set by a test, runs with the threads stopped after a
// write's puns are planned and before their pages are mapped: where the
// process may have mapped memory since its mappings were read.
var testBeforeMap func(d *Device, st *stopped)

// unplan undoes a plan whose trampoline pages could not be mapped: the
// trampolines it reserved are free again, live puns' lists of targets
// lose them, and the pages it added, unmapped, are dropped.
func (d *Device) unplan() {
	for _, t := range d.trampsNew {
		d.tramps.mark(t, d.tramps.at[t].n, false)
		delete(d.tramps.at, t)
	}
	d.trampsNew = d.trampsNew[:0]
	for _, p := range d.puns {
		p.targets = slices.DeleteFunc(p.targets, func(t uint64) bool {
			_, ok := d.tramps.at[t]
			return !ok
		})
	}
	for pg, p := range d.tramps.pages {
		if !p.mapped {
			delete(d.tramps.pages, pg)
		}
	}
}

// touchesPuns: a write of ops and changes meets a live pun's window.
func (d *Device) touchesPuns(ops []driver.SpliceOp, changes []windowChange) bool {
	if len(d.puns) == 0 {
		return false
	}
	for _, op := range ops {
		if len(d.punsOver(op.Addr, len(op.New))) > 0 {
			return true
		}
	}
	for _, c := range changes {
		if len(d.punsOver(c.addr, max(len(c.new), len(c.orig)))) > 0 {
			return true
		}
	}
	return false
}

// planChanges gives the live puns whose windows changes (removals,
// Resplice's) touch the trampolines of the states those leave: a write
// that would move one onto memory that cannot hold one is refused
// (ErrPunned).
func (d *Device) planChanges(changes []windowChange) error {
	if len(d.puns) == 0 {
		return nil
	}
	_, err := d.planPuns(nil, changes)
	if be := (*driver.BatchError)(nil); errors.As(err, &be) {
		return be.Err
	}
	return err
}

// plan is planPuns' work on the text as read (and as the write will
// leave it): puns[i] for each op i of want that takes a pun, highest
// address first, and the trampolines of the live puns whose windows the
// write touches; it returns the ops refused, and how many of the puns
// asked for (or live puns' states) found no room.
func (d *Device) plan(ops []driver.SpliceOp, changes []windowChange, want []int, puns []*pun, held map[int]*stopped) (refused []*driver.BatchError, missed int) {
	// Sized for every op and its bytes up front: grown from nothing, the
	// maps of a batch over libc (16,384 ops) were rehashed over and over.
	n := len(ops) + len(changes)
	v := &punView{d: d, held: held, changes: make(map[uint64]windowChange, n), cur: make(map[uint64]byte, 6*n)}
	for _, c := range changes {
		v.changes[c.addr] = c
		if c.gone {
			v.set(c.addr, c.orig)
		} else {
			v.set(c.addr, c.new)
		}
	}
	wanted := map[int]bool{}
	for _, i := range want {
		wanted[i] = true
	}
	for i, op := range ops {
		if !wanted[i] {
			orig := op.Orig
			if len(orig) > len(op.New) {
				orig = orig[:len(op.New)]
			}
			v.changes[op.Addr] = windowChange{windowSplice: windowSplice{addr: op.Addr, orig: orig, new: op.New}}
			v.set(op.Addr, op.New)
		}
	}
	slices.SortFunc(want, func(a, b int) int { return cmpAddr(ops[b].Addr, ops[a].Addr) })
	for w, i := range want {
		op := ops[i]
		p, err := v.place(op.Addr, op.Inst, op.Patch, v.leavesRoom(ops, want[w+1:], op))
		if err != nil {
			missed++
			if d.noInt3 != "" {
				refused = append(refused, &driver.BatchError{Op: "splice", Index: i, Where: fmt.Sprintf("%#x", op.Addr),
					Err: &NoPunError{Addr: op.Addr, Len: len(op.Inst), Why: err, Reason: d.noInt3}})
				continue
			}
			// Its int3 then: in the window of a pun placed after.
			v.changes[op.Addr] = windowChange{windowSplice: windowSplice{addr: op.Addr, orig: op.Inst[:1], new: op.New}}
			v.set(op.Addr, op.New)
			continue
		}
		puns[i] = p
		v.changes[op.Addr] = windowChange{windowSplice: windowSplice{addr: op.Addr, orig: p.inst, new: p.code}}
		v.set(op.Addr, p.code)
	}
	// The live puns whose windows the write touches.
	for a, c := range v.changes {
		for _, p := range d.punsOver(a, max(len(c.new), len(c.orig))) {
			if c, ok := v.changes[p.addr]; ok && c.gone {
				continue // out with this write
			}
			if err := v.ensure(p); err != nil {
				missed++
				refused = append(refused, &driver.BatchError{Op: "splice", Index: opIndex(ops, a), Where: fmt.Sprintf("%#x", a), Err: err})
			}
		}
	}
	return refused, missed
}

// leavesRoom is the rule for placing op's pun when the next pun the
// write places, lower, reads op's bytes in its window: op's choice of
// free bytes sets that pun's target too, so a choice is taken only if
// the lower pun still finds one (nil when no lower pun reads them). Op
// alone chose, and the lower pun was refused now and then where another
// choice was fine: TestPunnedSplices, a pun at every instruction of a
// function, failed 1 run in 30-150 on the 2-byte xor under a 4-byte
// lea's pun.
func (v *punView) leavesRoom(ops []driver.SpliceOp, lower []int, op driver.SpliceOp) func(code []byte) bool {
	if len(lower) == 0 {
		return nil
	}
	l := ops[lower[0]]
	if l.Addr+uint64(len(l.Inst))+4 <= op.Addr { // its window ends before op
		return nil
	}
	return func(code []byte) bool {
		return v.with(op.Addr, op.Inst, code, func() bool {
			_, err := v.choose(l.Addr, l.Inst, l.Patch, nil)
			return err == nil
		})
	}
}

// punsOver are the live puns (other than one at a) whose windows meet the
// n bytes at a. A pun's window lies within 8 bytes after it.
func (d *Device) punsOver(a uint64, n int) []*pun {
	var out []*pun
	for pa := a - 8; pa < a+uint64(n); pa++ {
		if p := d.puns[pa]; p != nil && pa != a {
			if lo, hi := p.window(); lo < a+uint64(n) && a < hi {
				out = append(out, p)
			}
		}
	}
	return out
}

// onTrampoline: pc is in a page of trampolines.
func (d *Device) onTrampoline(pc uint64) bool {
	d.punMu.Lock()
	defer d.punMu.Unlock()
	return d.tramps.inPages(pc)
}

// NoPunError refuses a trap splice that no punned jmp replaces, where an
// int3 is refused too.
type NoPunError struct {
	Addr   uint64
	Len    int
	Why    error  // why no pun fits
	Reason string // why an int3 is refused (TrapHazard)
}

func (e *NoPunError) Error() string {
	return fmt.Sprintf("%s; and no punned jmp replaces it over this %d-byte instruction: %v", e.Reason, e.Len, e.Why)
}

func (e *NoPunError) Unwrap() error { return e.Why }

// repoint leads pun p (splice s) to patch: each of its trampolines jumps
// there from now on (a thread stopped on one goes to the new patch; one
// in the old patch keeps it from being freed).
func (d *Device) repoint(p *pun, s *spliced, patch uint64) error {
	if p == nil {
		return fmt.Errorf("resplice %#x: no punned jmp there", s.addr)
	}
	// A longer jump (the patch out of rel32 reach) needs the bytes after
	// the trampoline free.
	for _, t := range p.targets {
		tr := d.tramps.at[t]
		if n := len(trampoline(t, patch)); n > tr.n && !d.tramps.fits(t+uint64(tr.n), n-tr.n) {
			return fmt.Errorf("resplice %#x: no room at trampoline %#x for a jump to %#x", s.addr, t, patch)
		}
	}
	err := d.withStopped(func(map[int]*stopped) error {
		for _, t := range p.targets {
			if err := d.mem.write(t, trampoline(t, patch)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, t := range p.targets {
		tr := d.tramps.at[t]
		if n := len(trampoline(t, patch)); n > tr.n {
			d.tramps.mark(t+uint64(tr.n), n-tr.n, true)
			tr.n = n
		}
		tr.patch = patch
		d.tramps.at[t] = tr
	}
	d.mu.Lock()
	p.patch, s.patch = patch, patch
	d.mu.Unlock()
	return nil
}
