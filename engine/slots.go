package engine

import "fmt"

// slotAllocator hands out counter slots. Protected by Engine.mu.
type slotAllocator struct {
	n    int
	used map[int]bool
	next int
}

func (a *slotAllocator) alloc() (int, error) {
	for i := 0; i < a.n; i++ {
		s := (a.next + i) % a.n
		if !a.used[s] {
			a.used[s] = true
			a.next = s + 1
			return s, nil
		}
	}
	return 0, fmt.Errorf("all %d counter slots in use", a.n)
}

func (a *slotAllocator) free(s int) { delete(a.used, s) }

// allocRange takes n consecutive free slots.
func (a *slotAllocator) allocRange(n int) (int, error) {
	for start := 0; start+n <= a.n; start++ {
		ok := true
		for i := start; i < start+n; i++ {
			if a.used[i] {
				ok, start = false, i
				break
			}
		}
		if ok {
			for i := start; i < start+n; i++ {
				a.used[i] = true
			}
			return start, nil
		}
	}
	return 0, fmt.Errorf("no %d consecutive counter slots free", n)
}

// ReserveCounters takes n consecutive counter slots (a task table must be
// contiguous), zeroed, for snippets that address them directly rather
// than through a request's own slots. ReleaseCounters gives them back.
func (e *Engine) ReserveCounters(n int) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	base, err := e.slots.allocRange(n)
	if err != nil {
		return 0, err
	}
	if err := e.dev.ClearCounters(base, n); err != nil {
		for i := base; i < base+n; i++ {
			e.slots.free(i)
		}
		return 0, err
	}
	return base, nil
}

// ReleaseCounters returns n slots from first, once no request's snippet
// writes them any more.
func (e *Engine) ReleaseCounters(first, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := first; i < first+n; i++ {
		e.slots.free(i)
	}
}
