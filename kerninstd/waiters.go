package kerninstd

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kinst/kinst/api"
	"github.com/kinst/kinst/cfg"
	"github.com/kinst/kinst/codegen"
	"github.com/kinst/kinst/kernel"
	"github.com/kinst/kinst/splice"
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
func (tm *timing) lockAddress(spec string) (uint64, string, error) {
	if v, ok := strings.CutPrefix(spec, "0x"); ok {
		a, err := strconv.ParseUint(v, 16, 64)
		if err != nil || a < 1<<63 {
			return 0, "", badRequest(fmt.Errorf("lock %q: want a kernel address 0xffff…", spec))
		}
		return a, spec, nil
	}
	sym, ok := dataSymbol(tm.plan.Symbols(), spec)
	if !ok {
		// Maybe a module loaded since the snapshot.
		if syms, err := tm.plan.ReloadSymbols(); err == nil {
			sym, ok = dataSymbol(syms, spec)
		}
	}
	switch {
	case !ok:
		return 0, "", fmt.Errorf("%w: %q is not a kernel data symbol (give 0xADDR for a lock inside a structure)", ErrNoLock, spec)
	case !strings.ContainsRune("dDbB", rune(sym.Type)):
		return 0, "", badRequest(fmt.Errorf("%w: %s is not data (kallsyms type %c)", ErrNoLock, spec, sym.Type))
	case sym.Addr == 0:
		return 0, "", fmt.Errorf("%s: kallsyms address 0: %w", spec, kernel.ErrHiddenAddresses)
	}
	return sym.Addr, fmt.Sprintf("%s (%#x)", spec, sym.Addr), nil
}

// dataSymbol finds the symbol called name, of any type, the core kernel's
// first.
func dataSymbol(syms *kernel.Symbols, name string) (kernel.Symbol, bool) {
	named := syms.Named(name)
	for _, s := range named {
		if s.Module == "" {
			return s, true
		}
	}
	if len(named) > 0 {
		return named[0], true
	}
	return kernel.Symbol{}, false
}

// lockWaitFunction is the function a task waits for a mutex in: the
// slow path, or the function it tail-calls.
func (tm *timing) lockWaitFunction() (string, error) {
	f, p, err := tm.plan.Func(MutexSlowPath)
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
func (tm *timing) resolveWaiters(req api.SessionRequest) ([]*timedFunc, codegen.Predicate, error) {
	if len(req.Timers) > 0 || len(req.Regions) > 0 || req.Filter != nil {
		return nil, nil, badRequest(errors.New("a lock request takes no functions or filter"))
	}
	addr, desc, err := tm.lockAddress(req.Lock)
	if err != nil {
		return nil, nil, err
	}
	name, err := tm.lockWaitFunction()
	if err != nil {
		return nil, nil, err
	}
	if err := tm.loadTaskLayout(); err != nil {
		return nil, nil, fmt.Errorf("waiters need the task layout: %w", err)
	}
	sw, err := tm.resolveSwitch()
	if err != nil {
		return nil, nil, err
	}
	t, err := tm.resolveTimed(name)
	if err != nil {
		return nil, nil, &splice.PointError{Point: name, Err: err}
	}
	t.filter = "lock " + desc
	t.virtual = &virtualState{sw: sw, base: -1}
	return []*timedFunc{t}, codegen.RegEquals{Reg: codegen.RDI, Value: addr}, nil
}
