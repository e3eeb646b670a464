package process

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kinst/kinst/driver"
	"github.com/kinst/kinst/patchheap"
)

// Sizes of the region kinst maps into the process: the patch heap, then
// the counters, one memfd shared by kinst and the process.
const (
	// Room for a probe at every block of libc, its static functions
	// included (named by libc6-dbg's symbols): 71,069 blocks in 2.36.
	// Pages are touched only as used.
	HeapSize    = 16 << 20
	NumCounters = 1 << 17
	regionSize  = HeapSize + NumCounters*8
	granule     = 16
	batchMax    = 1024
	retries     = 200 // stop-and-check rounds before ErrBusy
)

// Device is a running process as the splicing engine's device
// (engine.Device): the patch heap and the counters are a memfd that kinst
// and the process both map (kinst writes patches and reads counts
// through its own mapping, with the process running); text changes are
// written through /proc/PID/mem with every thread stopped by ptrace and
// none inside the bytes that change.
//
// If kinst dies, the process runs on: its splices lead into the memfd
// mapping, which stays valid in the process for as long as the mapping
// does. Detach (Close) restores every byte first.
type Device struct {
	pid  int
	near uint64
	tr   *tracer
	mem  *memFile
	// note is told when a thread is slow to stop (stopAll); set before
	// the device is used.
	note func(string)

	// regionMu serialises the mapping of the region; local and base are
	// written once, under it, before any patch or counter is used.
	regionMu sync.Mutex
	local    []byte // kinst's mapping of the region
	// unmapped: Close unmapped local. The engine's reclaim, on a timer,
	// may clear counters after that; counters then read 0 and clear to
	// nothing. Protected by regionMu.
	unmapped  bool
	base      uint64 // the region's address in the process; 0 until mapped
	regionErr error

	traps *trapSet // shared by the devices of one Target

	mu          sync.Mutex // protects heap, quarantine, quarantined, splices, live, next, closed and gone (splices and live change under punMu too)
	closed      bool
	gone        bool            // the process exited or ran exec (Target.Abandon): Close touches nothing
	quarantine  []uint64        // freed patches not yet given back to heap, oldest first
	quarantined map[uint64]bool // the same, to refuse a second free
	heap        *patchheap.Heap
	splices     map[uint32]*spliced
	live        map[uint64]uint32 // splices by address
	next        uint32

	// punMu serialises the splice writes, which plan punned jumps and
	// their trampolines; it protects punning, noInt3, puns, tramps,
	// trampsNew and loopAt.
	punMu     sync.Mutex
	punning   bool   // a trap splice becomes a punned jmp where one fits (SetPunning)
	noInt3    string // a trap splice no pun fits is refused with this reason (SetPunning)
	puns      map[uint64]*pun
	tramps    trampSpace
	trampsNew []uint64 // trampolines reserved, not yet written
	loopAt    uint64   // mmapLoop's code in the patch region; 0 until written
}

// SetPunning makes a trap splice a punned jmp where one fits (pun.go),
// and where none does an int3 or, when noInt3 is not "", a refusal with
// that reason (a thread that reaches an int3 with SIGTRAP blocked dies).
func (d *Device) SetPunning(on bool, noInt3 string) {
	d.punMu.Lock()
	defer d.punMu.Unlock()
	d.punning, d.noInt3 = on, noInt3
}

// Punned: the splice at addr is a punned jmp.
func (d *Device) Punned(addr uint64) bool {
	d.punMu.Lock()
	defer d.punMu.Unlock()
	_, ok := d.puns[addr]
	return ok
}

// spliced is one splice: the bytes written at addr and those they
// replaced.
type spliced struct {
	addr      uint64
	orig, new []byte
	patch     uint64 // a trap splice's: where its int3 leads
	slot      bool   // a springboard slot's jmp, in the padding between functions
	pun       bool   // a punned jmp (pun.go): orig is the instruction
}

func (s *spliced) trap() bool { return len(s.new) == 1 && s.new[0] == 0xcc }

// Open opens pid's memory for a device whose region will be mapped
// within rel32 reach of near (the text to be spliced) when the engine
// first needs it: reading and planning write nothing into the process, so
// a request refused before it splices leaves no mapping behind.
func Open(pid int, near uint64) (*Device, error) {
	return open(pid, near, &trapSet{})
}

// open is Open for one of several devices of a Target, which share ts.
func open(pid int, near uint64, ts *trapSet) (*Device, error) {
	if err := unix.Kill(pid, 0); err != nil {
		if err == unix.ESRCH {
			return nil, fmt.Errorf("%w: %d", ErrNoProcess, pid)
		}
		return nil, fmt.Errorf("%w: %d: %v", ErrNotTraceable, pid, err)
	}
	mem, err := openMem(pid)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotTraceable, err)
	}
	return &Device{pid: pid, near: near, tr: newTracer(), mem: mem, traps: ts, splices: map[uint32]*spliced{}, live: map[uint64]uint32{},
		puns: map[uint64]*pun{}, tramps: trampSpace{pages: map[uint64]*trampPage{}, at: map[uint64]tramp{}}}, nil
}

// region maps the region into the process the first time it is called,
// and says whether that worked.
func (d *Device) region() error {
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	if d.base != 0 || d.regionErr != nil {
		return d.regionErr
	}
	if err := d.mapRegion(d.near); err != nil {
		d.regionErr = err
		return err
	}
	h, err := patchheap.New(d.base, HeapSize, granule)
	if err != nil {
		d.regionErr = err
		return err
	}
	d.mu.Lock()
	d.heap = h
	d.mu.Unlock()
	return nil
}

// Mapped: the region is in the process.
func (d *Device) Mapped() bool {
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	return d.base != 0
}

// mapRegion has the process map the region (mmap, run by one of its
// threads) at a free address near near; kinst maps it too (regionFile).
func (d *Device) mapRegion(near uint64) error {
	at, err := freeNear(d.pid, near, regionSize)
	if err != nil {
		return err
	}
	return d.tr.do(func() error {
		held, err := stopAll(d.pid, d.note)
		if err != nil {
			return err
		}
		defer resumeAll(d.pid, held)
		st := anyThread(held)
		rfd, local, err := d.regionFile(st)
		if err != nil {
			return err
		}
		defer remoteSyscall(d.mem, st, unix.SYS_CLOSE, rfd)
		got, merr := remoteSyscall(d.mem, st, unix.SYS_MMAP, at, regionSize,
			unix.PROT_READ|unix.PROT_WRITE|unix.PROT_EXEC, unix.MAP_SHARED|unix.MAP_FIXED_NOREPLACE, rfd, 0)
		if merr == nil && got != at {
			remoteSyscall(d.mem, st, unix.SYS_MUNMAP, got, regionSize)
			merr = fmt.Errorf("mapped at %#x, not %#x", got, at)
		}
		if merr != nil {
			unix.Munmap(local)
			return fmt.Errorf("map the patch region into process %d at %#x: %w%s", d.pid, at, merr, seccompNote(d.pid))
		}
		d.local, d.base = local, at
		return nil
	})
}

// regionFile makes the region's memfd, open in the process (rfd, for the
// caller to close there) and mapped here (local). The process makes it
// (memfd_create, ftruncate) and kinst maps it through /proc/PID/fd: a
// process in a container (its own pid namespace and /proc) cannot see
// kinst's /proc entries, while kinst sees every process's. Where the
// process may not make one (a seccomp filter), it opens kinst's instead,
// through /proc/KINST/fd/N. st is a stopped thread of the process.
func (d *Device) regionFile(st *stopped) (rfd uint64, local []byte, err error) {
	// Names and paths go below the thread's red zone.
	scratch := (st.regs.Rsp - 4096) &^ 15
	if err := d.mem.write(scratch, []byte("kinst-patches\x00")); err != nil {
		return 0, nil, err
	}
	rfd, err = remoteSyscall(d.mem, st, unix.SYS_MEMFD_CREATE, scratch, unix.MFD_CLOEXEC)
	if err == nil {
		if _, err := remoteSyscall(d.mem, st, unix.SYS_FTRUNCATE, rfd, regionSize); err != nil {
			remoteSyscall(d.mem, st, unix.SYS_CLOSE, rfd)
			return 0, nil, fmt.Errorf("size the patch region in process %d: %w", d.pid, err)
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", d.pid, rfd), os.O_RDWR, 0)
		if err == nil {
			local, err = unix.Mmap(int(f.Fd()), 0, regionSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			f.Close()
		}
		if err != nil {
			remoteSyscall(d.mem, st, unix.SYS_CLOSE, rfd)
			return 0, nil, fmt.Errorf("map process %d's patch region: %w", d.pid, err)
		}
		return rfd, local, nil
	}
	made := err
	fd, err := unix.MemfdCreate("kinst-patches", unix.MFD_CLOEXEC)
	if err != nil {
		return 0, nil, err
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, regionSize); err != nil {
		return 0, nil, err
	}
	if local, err = unix.Mmap(fd, 0, regionSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return 0, nil, err
	}
	path := fmt.Sprintf("/proc/%d/fd/%d\x00", os.Getpid(), fd)
	if err := d.mem.write(scratch, []byte(path)); err != nil {
		unix.Munmap(local)
		return 0, nil, err
	}
	cwd := int64(unix.AT_FDCWD)
	rfd, err = remoteSyscall(d.mem, st, unix.SYS_OPENAT, uint64(cwd), scratch, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Munmap(local)
		return 0, nil, fmt.Errorf("make the patch region in process %d: %v; open kinst's: %w%s", d.pid, made, err, seccompNote(d.pid))
	}
	return rfd, local, nil
}

func anyThread(held map[int]*stopped) *stopped {
	tids := make([]int, 0, len(held))
	for tid := range held {
		tids = append(tids, tid)
	}
	sort.Ints(tids)
	return held[tids[0]] // the lowest: the main thread if it lives
}

// freeNear finds size free bytes in pid's address space whose every
// byte is within a rel32 jump of near, as close to it as it can.
func freeNear(pid int, near uint64, size uint64) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrNoProcess, err)
	}
	defer f.Close()
	type span struct{ lo, hi uint64 }
	var used []span
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		r, _, _ := strings.Cut(sc.Text(), " ")
		lo, hi, ok := strings.Cut(r, "-")
		if !ok {
			continue
		}
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 == nil && err2 == nil {
			used = append(used, span{a, b})
		}
	}
	const guard = 1 << 16       // keep off the neighbours (stack and heap growth)
	const reach = 1<<31 - 1<<20 // rel32, with room for the region itself
	const lowest, highest = 1 << 16, 1<<47 - 1<<12
	best, found := uint64(0), false
	dist := func(a uint64) uint64 {
		if a > near {
			return a + size - near
		}
		return near - a
	}
	prev := uint64(lowest)
	used = append(used, span{highest, highest})
	for _, u := range used {
		lo, hi := prev+guard, u.lo
		if u.lo > guard {
			hi = u.lo - guard
		}
		prev = max(prev, u.hi)
		if hi <= lo || hi-lo < size {
			continue
		}
		// The place in [lo, hi-size] closest to near, page-aligned.
		a := min(max(near&^0xfff, lo), hi-size)
		a = (a + 0xfff) &^ 0xfff
		if a+size > hi {
			continue
		}
		if dist(a) < reach && (!found || dist(a) < dist(best)) {
			best, found = a, true
		}
	}
	if !found {
		return 0, fmt.Errorf("no %d free bytes within a rel32 jump of %#x in process %d", size, near, pid)
	}
	return best, nil
}

// Base is the region's address in the process; PatchHeapUsed the heap
// bytes allocated.
func (d *Device) Base() uint64 {
	if d.region() != nil {
		return 0
	}
	return d.base
}

func (d *Device) inRegion(addr uint64, n int) bool {
	return d.base != 0 && addr >= d.base && addr+uint64(n) <= d.base+regionSize
}

// Read reads the process's memory (the region from kinst's mapping).
func (d *Device) Read(addr uint64, b []byte) error {
	if d.inRegion(addr, len(b)) {
		copy(b, d.local[addr-d.base:])
		return nil
	}
	return d.mem.read(addr, b)
}

func (d *Device) PatchAlloc(size int) (uint64, error) {
	if err := d.region(); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	a, err := d.heap.Alloc(size)
	if errors.Is(err, patchheap.ErrFull) && len(d.quarantine) > 0 {
		if err := d.releaseQuarantine(); err != nil {
			return 0, err
		}
		a, err = d.heap.Alloc(size)
	}
	if err != nil {
		return 0, err
	}
	// The allocation's bytes past the patch are int3s: a stray jump
	// into them traps. (The heap is filled as it is used: pages of it
	// never allocated are never touched.)
	n, _ := d.heap.Len(a)
	for i := a - d.base; i < a-d.base+n; i++ {
		d.local[i] = 0xcc
	}
	return a, nil
}

// PatchWrite writes a patch through kinst's mapping: the engine writes
// only patches no splice leads to, so no thread runs there.
func (d *Device) PatchWrite(addr uint64, code []byte) error {
	if err := d.region(); err != nil {
		return err
	}
	if !d.inRegion(addr, len(code)) || addr+uint64(len(code)) > d.base+HeapSize {
		return fmt.Errorf("patch write %#x+%d outside the patch heap", addr, len(code))
	}
	copy(d.local[addr-d.base:], code)
	return nil
}

func (d *Device) PatchWriteMany(ps []driver.PatchCode) error {
	for _, p := range ps {
		if err := d.PatchWrite(p.Addr, p.Code); err != nil {
			return err
		}
	}
	return nil
}

// PatchFree frees a patch. Its bytes stay as they are and the space is
// not reused until the heap is full (releaseQuarantine): a thread a signal
// interrupted inside the patch, whose saved pc is on its stack where kinst
// does not look, returns into the same code, and so does a child forked
// while the splice was in, whose copy of the text still leads there (at
// worst a count lands in a slot that has been handed on). Freeing stops
// no thread: the check that no pc is inside is made once for all the
// quarantined patches, when they are given back.
func (d *Device) PatchFree(addr uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil // detached: the region is the process's now, unused
	}
	if _, ok := d.heap.Len(addr); !ok || d.quarantined[addr] {
		return fmt.Errorf("patch free %#x: not allocated", addr)
	}
	if d.quarantined == nil {
		d.quarantined = map[uint64]bool{}
	}
	d.quarantine = append(d.quarantine, addr)
	d.quarantined[addr] = true
	return nil
}

// releaseQuarantine gives back to the heap every quarantined patch no
// thread's pc is inside, with the threads stopped once (the user-space
// stand-in for the kernel's RCU-tasks wait: patches hold no return
// address, a relocated call returns to the original text). A thread in
// the SIGTRAP handler, which may be about to jump to a patch it read from
// its table, holds them all back: kinst lets the threads go and looks
// again. The caller holds d.mu.
func (d *Device) releaseQuarantine() error {
	under := map[uint64]bool{} // quarantined patches a thread's pc is in
	err := d.withStopped(func(held map[int]*stopped) error {
		clear(under)
		for _, st := range held {
			// A thread on a trampoline is about to enter a patch.
			if d.traps.inHandler(st.regs.Rip) || d.onTrampoline(st.regs.Rip) {
				return errRetry
			}
		}
		for _, a := range d.quarantine {
			n, _ := d.heap.Len(a)
			for _, st := range held {
				if pc := st.regs.Rip; pc >= a && pc < a+n {
					under[a] = true
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var keep []uint64
	for _, a := range d.quarantine {
		if under[a] {
			keep = append(keep, a)
			continue
		}
		delete(d.quarantined, a)
		if _, err := d.heap.Free(a); err != nil {
			return err
		}
	}
	d.quarantine = keep
	return nil
}

var errRetry = fmt.Errorf("retry")

// withStopped runs f with every thread stopped, letting them go and
// trying again (up to retries times) while f says errRetry.
func (d *Device) withStopped(f func(map[int]*stopped) error) error {
	for i := 0; i < retries; i++ {
		err := d.tr.do(func() error {
			held, err := stopAll(d.pid, d.note)
			if err != nil {
				return err
			}
			defer resumeAll(d.pid, held)
			return f(held)
		})
		if err != errRetry {
			return err
		}
		time.Sleep(time.Duration(i+1) * 100 * time.Microsecond)
	}
	return ErrBusy
}

// write replaces the bytes of each op at once, with every thread
// stopped: each op's current bytes must be its want (else nothing is
// written), and no thread's pc may be inside any op's bytes past the
// first (a thread there would resume mid-instruction). Ops close together
// are read and written as one run of bytes (opRuns): a batch over libc
// is tens of thousands of ops, and two syscalls each were most of its
// time.
func (d *Device) write(ops []spliced) error {
	runs := opRuns(ops)
	return d.withStopped(func(held map[int]*stopped) error {
		for _, r := range runs {
			if err := d.mem.read(r.addr, r.buf); err != nil {
				return err
			}
			for _, op := range r.ops {
				cur := r.buf[op.addr-r.addr:][:len(op.orig)]
				if !bytes.Equal(cur, op.orig) {
					return fmt.Errorf("%w: %#x holds %x, not %x", driver.ErrStale, op.addr, cur, op.orig)
				}
				for _, st := range held {
					// A slot's jmp is all a thread there runs: restoring the
					// padding under it would send it into the next function.
					lo := op.addr + 1
					if op.slot {
						lo = op.addr
					}
					if pc := st.regs.Rip; pc >= lo && pc < op.addr+uint64(len(op.new)) {
						return errRetry
					}
				}
			}
		}
		for _, r := range runs {
			for _, op := range r.ops {
				copy(r.buf[op.addr-r.addr:], op.new)
			}
			if err := d.mem.write(r.addr, r.buf); err != nil {
				return err
			}
		}
		return nil
	})
}

// opRun is ops that lie close together, read and written as the bytes
// [addr, addr+len(buf)): the bytes between them are written back as they
// were read, with every thread stopped.
type opRun struct {
	addr uint64
	buf  []byte
	ops  []spliced
}

// Ops closer than runGap join one run (less than a page apart, so a run
// writes no page an op does not: each page written is copied for the
// process once, and only the ones spliced), up to runMax bytes.
const (
	runGap = 4096
	runMax = 256 << 10
)

// opRuns groups ops by address into runs. Ops that overlap (never, from
// the engine) go to runs of their own, so each is checked and written
// as it alone asks.
func opRuns(ops []spliced) []opRun {
	sorted := slices.Clone(ops)
	slices.SortStableFunc(sorted, func(a, b spliced) int { return cmp.Compare(a.addr, b.addr) })
	var runs []opRun
	var end uint64
	for _, op := range sorted {
		opEnd := op.addr + uint64(max(len(op.orig), len(op.new)))
		if n := len(runs); n > 0 && op.addr >= end && op.addr-end < runGap && opEnd-runs[n-1].addr <= runMax {
			r := &runs[n-1]
			r.ops = append(r.ops, op)
			end = opEnd
			continue
		}
		runs = append(runs, opRun{addr: op.addr, ops: []spliced{op}})
		end = opEnd
	}
	for i := range runs {
		last := runs[i].ops[len(runs[i].ops)-1]
		runs[i].buf = make([]byte, last.addr+uint64(max(len(last.orig), len(last.new)))-runs[i].addr)
	}
	return runs
}

// SpliceOp splices op on its own: a trap splice's may be a punned jmp
// (driver.SpliceOp.Inst).
func (d *Device) SpliceOp(op driver.SpliceOp) (uint32, error) { return d.splice(op) }

func (d *Device) splice(op driver.SpliceOp) (uint32, error) {
	ids, err := d.SpliceBatch([]driver.SpliceOp{op})
	if err != nil {
		var be *driver.BatchError
		if errors.As(err, &be) {
			return 0, be.Err
		}
		return 0, err
	}
	return ids[0], nil
}

func (d *Device) Splice(addr, patch uint64, orig, new []byte) (uint32, error) {
	return d.splice(driver.SpliceOp{Addr: addr, Patch: patch, Orig: orig, New: new})
}
func (d *Device) SpliceSlot(addr, patch uint64, orig, new []byte) (uint32, error) {
	return d.splice(driver.SpliceOp{Addr: addr, Patch: patch, Orig: orig, New: new, Slot: true})
}

// SpliceCovering writes the covering jmp at once: with every thread
// stopped outside the covered bytes, none can be between them.
func (d *Device) SpliceCovering(addr, patch uint64, orig, new []byte) (uint32, error) {
	return d.splice(driver.SpliceOp{Addr: addr, Patch: patch, Orig: orig, New: new, Covering: true})
}

func (d *Device) FinishCovering() (int, error) { return 0, nil }

// Resplice points splice id's jmp rel32 at patch.
func (d *Device) Resplice(id uint32, patch uint64) error {
	d.punMu.Lock()
	defer d.punMu.Unlock()
	d.mu.Lock()
	s := d.splices[id]
	if s != nil && s.trap() {
		// A thread whose SIGTRAP is on its way goes to the new patch;
		// one already in the old patch keeps it from being freed.
		s.patch = patch
		d.mu.Unlock()
		return d.traps.point(s.addr, patch)
	}
	d.mu.Unlock()
	if s != nil && s.pun {
		return d.repoint(d.puns[s.addr], s, patch)
	}
	if s == nil || len(s.new) != 5 || s.new[0] != 0xe9 {
		return fmt.Errorf("resplice %d: no jmp rel32 splice", id)
	}
	rel := int64(patch) - int64(s.addr+5)
	if rel != int64(int32(rel)) {
		return fmt.Errorf("resplice %d: %#x out of reach of %#x", id, patch, s.addr)
	}
	jmp := []byte{0xe9, 0, 0, 0, 0}
	binary.LittleEndian.PutUint32(jmp[1:], uint32(int32(rel)))
	if err := d.planChanges([]windowChange{{windowSplice: windowSplice{addr: s.addr, orig: s.orig, new: jmp}}}); err != nil {
		return err
	}
	if err := d.write([]spliced{{addr: s.addr, orig: s.new, new: jmp}}); err != nil {
		return err
	}
	d.mu.Lock()
	s.new = jmp
	d.mu.Unlock()
	return nil
}

func (d *Device) Unsplice(id uint32) error { return d.UnspliceBatch([]uint32{id}) }

// SpliceBatch splices every op with the threads stopped once, all or
// none. A trap splice's int3 is entered in the SIGTRAP handler's table
// before it is written (the handler is installed with the first).
func (d *Device) SpliceBatch(ops []driver.SpliceOp) ([]uint32, error) {
	d.punMu.Lock()
	defer d.punMu.Unlock()
	puns, err := d.planPuns(ops, nil)
	if err != nil {
		return nil, err
	}
	var ws []spliced
	var traps []uint64
	untrap := func() {
		for _, a := range traps {
			d.traps.point(a, a)
		}
	}
	for i, op := range ops {
		if p := puns[i]; p != nil {
			ws = append(ws, spliced{addr: op.Addr, orig: p.inst, new: p.code, patch: op.Patch, pun: true})
			continue
		}
		orig := op.Orig
		if len(orig) < len(op.New) {
			orig = make([]byte, len(op.New))
			if err := d.mem.read(op.Addr, orig); err != nil {
				untrap()
				return nil, err
			}
		}
		w := spliced{addr: op.Addr, orig: orig[:len(op.New)], new: op.New, patch: op.Patch, slot: op.Slot}
		if w.trap() {
			err := d.installTraps()
			if err == nil {
				err = d.traps.point(op.Addr, op.Patch)
			}
			if err != nil {
				untrap()
				return nil, &driver.BatchError{Op: "splice", Index: i, Where: fmt.Sprintf("%#x", op.Addr), Err: err}
			}
			traps = append(traps, op.Addr)
		}
		ws = append(ws, w)
	}
	if err := d.write(ws); err != nil {
		untrap()
		return nil, err
	}
	d.traps.count(len(traps))
	for _, p := range puns {
		if p != nil {
			d.puns[p.addr] = p
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ids := make([]uint32, len(ws))
	for i, w := range ws {
		d.next++
		d.splices[d.next] = &spliced{addr: w.addr, orig: bytes.Clone(w.orig), new: bytes.Clone(w.new), patch: w.patch, slot: w.slot, pun: w.pun}
		d.live[w.addr] = d.next
		ids[i] = d.next
	}
	return ids, nil
}

// UnspliceBatch puts back the original bytes of every splice in ids. A
// trap splice's table entry leads to its own address first: a SIGTRAP
// still on its way runs the original instruction once it is back.
func (d *Device) UnspliceBatch(ids []uint32) error {
	d.punMu.Lock()
	defer d.punMu.Unlock()
	d.mu.Lock()
	var ws []spliced
	var traps []*spliced
	for i, id := range ids {
		s := d.splices[id]
		if s == nil {
			d.mu.Unlock()
			return &driver.BatchError{Op: "unsplice", Index: i, Where: fmt.Sprint(id), Err: unix.ENOENT}
		}
		ws = append(ws, spliced{addr: s.addr, orig: s.new, new: s.orig, patch: s.patch, slot: s.slot, pun: s.pun})
		if s.trap() {
			traps = append(traps, s)
		}
	}
	d.mu.Unlock()
	// The puns over whose windows these splices lie get the trampolines of
	// the states left (reserved when each state became possible: this
	// only writes what a failed write left unwritten).
	changes := make([]windowChange, len(ws))
	for i, w := range ws {
		changes[i] = windowChange{windowSplice: windowSplice{addr: w.addr, orig: w.new, new: w.orig}, gone: true}
	}
	if err := d.planChanges(changes); err != nil {
		return err // a state no trampoline was reserved for: kinst's fault
	}
	for _, s := range traps {
		d.traps.point(s.addr, s.addr)
	}
	if err := d.write(ws); err != nil {
		for _, s := range traps {
			d.traps.point(s.addr, s.patch)
		}
		return err
	}
	d.traps.count(-len(traps))
	for _, w := range ws {
		if p := d.puns[w.addr]; w.pun && p != nil {
			d.tramps.retire(p.targets)
			delete(d.puns, w.addr)
		}
	}
	d.mu.Lock()
	for _, id := range ids {
		if s := d.splices[id]; s != nil {
			delete(d.live, s.addr)
		}
		delete(d.splices, id)
	}
	d.mu.Unlock()
	return nil
}

func (d *Device) BatchMax() int { return batchMax }

func (d *Device) counter(slot int) *uint64 {
	return (*uint64)(unsafe.Pointer(&d.local[HeapSize+8*slot]))
}

// Counter reads a counter with the process running (an atomic load of
// the shared page).
func (d *Device) Counter(slot int) uint64 {
	if slot < 0 || slot >= NumCounters {
		return 0
	}
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	if d.base == 0 || d.unmapped {
		return 0
	}
	return atomic.LoadUint64(d.counter(slot))
}

func (d *Device) CounterAddr(slot int) uint64 { return d.Base() + HeapSize + 8*uint64(slot) }
func (d *Device) NumCounters() int            { return NumCounters }

func (d *Device) ClearCounters(first, n int) error {
	if first < 0 || n < 0 || first+n > NumCounters {
		return fmt.Errorf("counters %d+%d out of range", first, n)
	}
	if err := d.region(); err != nil {
		return err
	}
	d.regionMu.Lock()
	defer d.regionMu.Unlock()
	if d.unmapped {
		return nil // gone with the mapping
	}
	for i := first; i < first+n; i++ {
		atomic.StoreUint64(d.counter(i), 0)
	}
	return nil
}

// Splices is the number of splices installed.
func (d *Device) Splices() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.splices)
}

// Close restores every splice still installed (with the threads stopped
// once) and lets the process go. The region stays mapped in the process,
// unused: a thread could still be returning through it.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	var ids []uint32
	for id := range d.splices {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	var err error
	if len(ids) > 0 {
		err = d.UnspliceBatch(ids)
		if unix.Kill(d.pid, 0) == unix.ESRCH {
			err = nil // the process is gone, and its text with it
		}
	}
	d.mu.Lock()
	gone := d.gone
	d.mu.Unlock()
	if err == nil && !gone && d.traps.installed() {
		d.withStopped(func(held map[int]*stopped) error { d.uninstallTraps(held); return nil })
	}
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.tr.close()
	d.mem.close()
	d.regionMu.Lock()
	if d.local != nil && !d.traps.ownedBy(d) { // the owner's view holds the trap table
		unix.Munmap(d.local)
		d.unmapped = true
	}
	d.regionMu.Unlock()
	return err
}

// seccompNote says when the process runs under a seccomp filter, which
// may forbid the system calls kinst has it make (memfd_create, mmap with
// PROT_EXEC): a service's SystemCallFilter, a container runtime's profile.
func seccompNote(pid int) string {
	if st, err := readStatus(fmt.Sprintf("/proc/%d/status", pid)); err == nil && st["Seccomp"] == "2" {
		return " (the process runs under a seccomp filter, which may forbid it)"
	}
	return ""
}
