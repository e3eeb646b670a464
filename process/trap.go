package process

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// trapHandler is testdata/sigtrap.S assembled (TestTrapHandlerBytes
// checks it): kinst's SIGTRAP handler, then its rt_sigreturn restorer.
// The trap table follows at trapTable: {int3 address, target, last
// patch, unused} entries, 32 bytes each, trapEntries of them, a hash
// table: an address's home entry is trapHome(addr), and a lookup probes
// on from there until it finds the address or a zero one. A removed
// splice's target is its own address; the handler then sends a thread
// whose text still has the int3 (a child forked while it was in, whose
// copy of the text kinst never restores) to the last patch, whose code
// stays.
var trapHandler = []byte{
	0x48, 0x8b, 0x82, 0xa8, 0x00, 0x00, 0x00, 0x48, 0xff, 0xc8, 0x48, 0x89,
	0xc1, 0x48, 0xc1, 0xe9, 0x0c, 0x48, 0x31, 0xc1, 0x81, 0xe1, 0xff, 0x3f,
	0x00, 0x00, 0x48, 0xc1, 0xe1, 0x05, 0x4c, 0x8d, 0x0d, 0xdb, 0x00, 0x00,
	0x00, 0x4d, 0x8b, 0x04, 0x09, 0x4d, 0x85, 0xc0, 0x74, 0x2d, 0x49, 0x39,
	0xc0, 0x74, 0x0c, 0x48, 0x83, 0xc1, 0x20, 0x81, 0xe1, 0xff, 0xff, 0x07,
	0x00, 0xeb, 0xe6, 0x4d, 0x8b, 0x44, 0x09, 0x08, 0x49, 0x39, 0xc0, 0x75,
	0x0a, 0x80, 0x38, 0xcc, 0x75, 0x05, 0x4d, 0x8b, 0x44, 0x09, 0x10, 0x4c,
	0x89, 0x82, 0xa8, 0x00, 0x00, 0x00, 0xc3, 0x48, 0x83, 0xec, 0x28, 0x31,
	0xc0, 0x48, 0x89, 0x04, 0x24, 0x48, 0x89, 0x44, 0x24, 0x08, 0x48, 0x89,
	0x44, 0x24, 0x10, 0x48, 0x89, 0x44, 0x24, 0x18, 0xb8, 0x0d, 0x00, 0x00,
	0x00, 0xbf, 0x05, 0x00, 0x00, 0x00, 0x48, 0x89, 0xe6, 0x31, 0xd2, 0x41,
	0xba, 0x08, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x48, 0x83, 0xc4, 0x28, 0xb8,
	0x27, 0x00, 0x00, 0x00, 0x0f, 0x05, 0x89, 0xc3, 0xb8, 0xba, 0x00, 0x00,
	0x00, 0x0f, 0x05, 0x89, 0xc6, 0x89, 0xdf, 0xba, 0x05, 0x00, 0x00, 0x00,
	0xb8, 0xea, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xc3, 0xb8, 0x0f, 0x00, 0x00,
	0x00, 0x0f, 0x05, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc,
}

const (
	trapRestorer = 0xb0  // restorer's offset in trapHandler
	trapTable    = 0x100 // the table's offset from the handler
	trapEntries  = 1 << 14
	trapMax      = trapEntries * 3 / 4 // filled no further: probes stay short
	trapEntry    = 32                  // {int3 address, target, last patch, unused}
	trapSize     = trapTable + trapEntries*trapEntry
	sigactSize   = 32 // struct kernel_sigaction: handler, flags, restorer, mask
	saSiginfo    = 0x4
	saRestorer   = 0x04000000 // x86-64 signal frames return through sa_restorer
)

// trapSet is the trap splices' machinery in the process, shared by every
// Device of one Target: the handler and its table (in the region of the
// device that installed it), and each int3's entry. An entry is never
// reused for another address: when its splice goes, its target becomes
// the address itself, so a thread whose SIGTRAP is still on its way runs
// the original instruction, which is back.
type trapSet struct {
	mu      sync.Mutex     // protects every field
	at      uint64         // the handler in the process; 0 before the first trap splice
	table   []byte         // kinst's view of the table (in the owner's mapping)
	owner   *Device        // whose region holds the handler
	entry   map[uint64]int // int3 address → table entry
	live    int            // trap splices installed, by every device
	refused error          // why the process takes no trap splice
	done    bool           // SIGTRAP's default action is back

	// handler is at, for inHandler, which runs under a device's mu with
	// the threads stopped: installTraps holds mu while it allocates (the
	// device's mu), so inHandler must not take it.
	handler atomic.Uint64
}

func (ts *trapSet) word(entry, w int) *uint64 {
	return (*uint64)(unsafe.Pointer(&ts.table[trapEntry*entry+8*w]))
}

// trapHome is addr's home entry, as the handler computes it.
func trapHome(addr uint64) int { return int((addr ^ addr>>12) & (trapEntries - 1)) }

// point points the int3 at addr to target (the patch; or addr itself,
// once the original bytes are back), through kinst's mapping: the target
// first, then the address that makes the entry visible. An entry is
// never emptied (a lookup must not stop short of the entries probed past
// it). The handler must be installed.
func (ts *trapSet) point(addr, target uint64) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	e, ok := ts.entry[addr]
	if !ok {
		if len(ts.entry) >= trapMax {
			return fmt.Errorf("%w: %d trap splices is the most a process takes", ErrUnsupported, trapMax)
		}
		e = trapHome(addr)
		for atomic.LoadUint64(ts.word(e, 0)) != 0 {
			e = (e + 1) % trapEntries
		}
		ts.entry[addr] = e
	}
	if target != addr {
		atomic.StoreUint64(ts.word(e, 2), target)
	}
	atomic.StoreUint64(ts.word(e, 1), target)
	atomic.StoreUint64(ts.word(e, 0), addr)
	return nil
}

// count adds n (or takes away -n) trap splices installed.
func (ts *trapSet) count(n int) {
	ts.mu.Lock()
	ts.live += n
	ts.mu.Unlock()
}

// installed: the handler is in the process.
func (ts *trapSet) installed() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.at != 0
}

// ownedBy: d's region holds the handler and the table.
func (ts *trapSet) ownedBy(d *Device) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.owner == d
}

// inHandler: pc is in kinst's SIGTRAP handler, which may be about to
// send its thread to a patch it has read from the table.
func (ts *trapSet) inHandler(pc uint64) bool {
	at := ts.handler.Load()
	return at != 0 && pc >= at && pc < at+uint64(len(trapHandler))
}

// installTraps copies the handler into d's patch heap and makes it the
// process's SIGTRAP handler, once per trapSet. A process that handles
// SIGTRAP itself (a runtime, a debugger's target, SIG_IGN) is left as it
// is and takes no trap splice: ErrUnsupported says why.
func (d *Device) installTraps() error {
	ts := d.traps
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.at != 0 || ts.refused != nil {
		return ts.refused
	}
	at, err := d.PatchAlloc(trapSize)
	if err != nil {
		return err
	}
	table := d.local[at-d.base+trapTable : at-d.base+trapSize]
	copy(d.local[at-d.base:], trapHandler)
	clear(table)
	act := make([]byte, 2*sigactSize)
	binary.LittleEndian.PutUint64(act[0:], at)
	binary.LittleEndian.PutUint64(act[8:], saSiginfo|saRestorer)
	binary.LittleEndian.PutUint64(act[16:], at+trapRestorer)
	err = d.withStopped(func(held map[int]*stopped) error {
		st := anyThread(held)
		scratch := (st.regs.Rsp - 4096) &^ 15 // below the red zone
		if err := d.mem.write(scratch, act); err != nil {
			return err
		}
		if _, err := remoteSyscall(d.mem, st, unix.SYS_RT_SIGACTION, uint64(unix.SIGTRAP), scratch, scratch+sigactSize, 8); err != nil {
			return fmt.Errorf("install kinst's SIGTRAP handler in process %d: %w", d.pid, err)
		}
		old := make([]byte, sigactSize)
		if err := d.mem.read(scratch+sigactSize, old); err != nil {
			return err
		}
		if h := binary.LittleEndian.Uint64(old); h != 0 { // not SIG_DFL: put it back
			if _, err := remoteSyscall(d.mem, st, unix.SYS_RT_SIGACTION, uint64(unix.SIGTRAP), scratch+sigactSize, 0, 8); err != nil {
				return fmt.Errorf("put back process %d's SIGTRAP handler: %w", d.pid, err)
			}
			return fmt.Errorf("%w: the process handles SIGTRAP itself (handler %#x), so an int3 of kinst's cannot be caught: no trap splice", ErrUnsupported, h)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, ErrUnsupported) {
			ts.refused = err
		}
		d.mu.Lock()
		d.heap.Free(at)
		d.mu.Unlock()
		return err
	}
	ts.at, ts.table, ts.owner = at, table, d
	ts.handler.Store(at)
	ts.entry = map[uint64]int{}
	return nil
}

// uninstallTraps gives SIGTRAP back its default action when no trap
// splice is left and no thread has a SIGTRAP on its way (held: every
// thread, stopped; a pending signal shows in /proc's SigPnd and ShdPnd).
// Otherwise the handler stays: its table sends any late trap to the
// original instruction.
func (d *Device) uninstallTraps(held map[int]*stopped) {
	ts := d.traps
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.at == 0 || ts.live > 0 || ts.done {
		return
	}
	for tid := range held {
		if sigtrapPending(d.pid, tid) {
			return
		}
	}
	st := anyThread(held)
	scratch := (st.regs.Rsp - 4096) &^ 15
	if d.mem.write(scratch, make([]byte, sigactSize)) != nil {
		return
	}
	if _, err := remoteSyscall(d.mem, st, unix.SYS_RT_SIGACTION, uint64(unix.SIGTRAP), scratch, 0, 8); err == nil {
		ts.done = true
	}
}

// sigtrapPending: SIGTRAP is pending for thread tid, or for the process
// (a status it cannot read counts as pending: the handler then stays).
func sigtrapPending(pid, tid int) bool {
	st, err := readStatus(fmt.Sprintf("/proc/%d/task/%d/status", pid, tid))
	if err != nil {
		return true
	}
	for _, k := range []string{"SigPnd", "ShdPnd"} {
		v, ok := st[k]
		if !ok {
			continue
		}
		mask, err := strconv.ParseUint(v, 16, 64)
		if err != nil || mask&(1<<(unix.SIGTRAP-1)) != 0 {
			return true
		}
	}
	return false
}
