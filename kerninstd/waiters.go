package kerninstd

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
)

// Waiters on a kernel mutex (KernInst's "average number of waiting
// threads", which instruments mutex_enter): a task waits for a mutex from
// the entry of its slow path until it returns holding it. mutex_lock
// takes the fast path (one cmpxchg) when the mutex is free and calls
// __mutex_lock_slowpath otherwise, which on this kernel tail-calls the
// function that spins and sleeps; that function is timed, for the one
// lock only (its first argument, %rdi, at the entry), with a task table
// so exits count only the tasks that entered for this lock, and with the
// virtual timer's switch hook, which splits the wait into spinning (on a
// CPU) and sleeping.

// MutexSlowPath is the slow path of mutex_lock.
const MutexSlowPath = "__mutex_lock_slowpath"

// ErrNoLock is returned for a lock that names no kernel data.
var ErrNoLock = errors.New("no such lock")

// lockAddress resolves 0xADDR or a data symbol from kallsyms.
func (d *Daemon) lockAddress(spec string) (uint64, string, error) {
	if v, ok := strings.CutPrefix(spec, "0x"); ok {
		a, err := strconv.ParseUint(v, 16, 64)
		if err != nil || a < 1<<63 {
			return 0, "", badRequest(fmt.Errorf("lock %q: want a kernel address 0xffff…", spec))
		}
		return a, spec, nil
	}
	f, err := os.Open(d.kallsyms)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || fields[2] != spec {
			continue
		}
		switch fields[1] {
		case "d", "D", "b", "B":
		default:
			return 0, "", badRequest(fmt.Errorf("%w: %s is not data (kallsyms type %s)", ErrNoLock, spec, fields[1]))
		}
		a, err := strconv.ParseUint(fields[0], 16, 64)
		if err != nil || a == 0 {
			return 0, "", fmt.Errorf("%s: kallsyms address %q: %w", spec, fields[0], kernel.ErrHiddenAddresses)
		}
		return a, fmt.Sprintf("%s (%#x)", spec, a), nil
	}
	if err := sc.Err(); err != nil {
		return 0, "", err
	}
	return 0, "", fmt.Errorf("%w: %q is not a kernel data symbol (give 0xADDR for a lock inside a structure)", ErrNoLock, spec)
}

// lockWaitFunction is the function a task waits for a mutex in: the
// slow path, or the function it tail-calls.
func (d *Daemon) lockWaitFunction() (string, error) {
	f, p, err := d.plan.Func(MutexSlowPath)
	if err == nil {
		_, err = f.Resolve(p)
	}
	if err != nil {
		return "", err
	}
	syms := f.Facts().Symbols
	for _, b := range f.Blocks {
		if b.Exit != cfg.TailCall {
			continue
		}
		if to, ok := cfg.BranchTarget(b.Last(f.Fn)); ok {
			if sym, off, ok := syms.At(to); ok && off == 0 {
				return sym.Name, nil
			}
		}
	}
	return MutexSlowPath, nil
}

// resolveWaiters builds the timer of a waiters request.
func (d *Daemon) resolveWaiters(req SessionRequest) ([]*timedFunc, codegen.Predicate, error) {
	if len(req.Timers) > 0 || req.Filter != nil {
		return nil, nil, badRequest(errors.New("a lock request takes no functions or filter"))
	}
	addr, desc, err := d.lockAddress(req.Lock)
	if err != nil {
		return nil, nil, err
	}
	name, err := d.lockWaitFunction()
	if err != nil {
		return nil, nil, err
	}
	if err := d.loadTaskLayout(); err != nil {
		return nil, nil, fmt.Errorf("waiters need the task layout: %w", err)
	}
	sw, err := d.resolveSwitch()
	if err != nil {
		return nil, nil, err
	}
	t, err := d.resolveTimed(name)
	if err != nil {
		return nil, nil, &PointError{Point: name, Err: err}
	}
	t.filter = "lock " + desc
	t.virtual = &virtualState{sw: sw, base: -1}
	return []*timedFunc{t}, codegen.RegEquals{Reg: codegen.RDI, Value: addr}, nil
}
