// Package parallel runs independent pieces of work on every CPU: For when
// each result has its own place, Map when results are handed back in
// order, to one goroutine (planning a whole kernel's functions on two
// vCPUs instead of one, while what the results feed stays single-
// threaded).
//
// Both hand work out in groups, not item by item: each hand-off between
// goroutines costs the scheduler a clock read, and under an emulator
// (TCG, a guest whose clock source is not the TSC) a whole-kernel
// session's million hand-offs spent a tenth of its time reading the clock.
package parallel

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
)

// group is how many items a goroutine takes at a time.
const group = 16

// For calls work(i) for every i in [0, n) on up to GOMAXPROCS goroutines
// at once, and returns when all have returned. A panic in work is raised
// again by For, on the calling goroutine.
func For(n int, work func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), (n+group-1)/group)
	if workers <= 1 {
		for i := range n {
			work(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				if p := recover(); p != nil {
					failed.CompareAndSwap(nil, fmt.Errorf("%v (in parallel work)", p))
				}
			}()
			for {
				lo := int(next.Add(group)) - group
				if lo >= n || failed.Load() != nil {
					return
				}
				for i := lo; i < min(lo+group, n); i++ {
					work(i)
				}
			}
		}()
	}
	wg.Wait()
	if p := failed.Load(); p != nil {
		panic(p)
	}
}

// Map calls work(i) for every i in [0, n), on up to GOMAXPROCS goroutines
// at once, and yield(i, result) on the calling goroutine in order of i.
// At most window results (8 groups per worker) are made ahead of the one
// being yielded, so memory stays bounded when results are big. When
// yield returns false no further work starts, and Map returns once the
// work already running has finished. A panic in work is raised again by
// Map, on the calling goroutine.
//
// work must be safe to call concurrently with itself; yield is never
// called concurrently.
func Map[T any](n int, work func(i int) T, yield func(i int, v T) bool) {
	groups := (n + group - 1) / group
	workers := min(runtime.GOMAXPROCS(0), groups)
	if workers <= 1 {
		for i := range n {
			if !yield(i, work(i)) {
				return
			}
		}
		return
	}
	type result struct {
		vs    []T
		panic any
	}
	window := 8 * workers
	// Group g's results go to results[g%window]: the feeder hands out g
	// only once g-window has been yielded (a token of sem), so the slot
	// is empty and the send never blocks.
	results := make([]chan result, window)
	for k := range results {
		results[k] = make(chan result, 1)
	}
	sem := make(chan struct{}, window)
	next := make(chan int)
	stop := make(chan struct{})
	go func() {
		defer close(next)
		for g := range groups {
			select {
			case sem <- struct{}{}:
			case <-stop:
				return
			}
			select {
			case next <- g:
			case <-stop:
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for g := range next {
				results[g%window] <- func() (r result) {
					i := g * group
					defer func() {
						if p := recover(); p != nil {
							r.panic = fmt.Errorf("%v (in parallel work %d)", p, i)
						}
					}()
					r.vs = make([]T, 0, min(group, n-g*group))
					for ; i < min((g+1)*group, n); i++ {
						r.vs = append(r.vs, work(i))
					}
					return r
				}()
			}
		}()
	}
	defer wg.Wait()
	for g := range groups {
		r := <-results[g%window]
		if r.panic != nil {
			close(stop)
			panic(r.panic)
		}
		for k, v := range r.vs {
			if !yield(g*group+k, v) {
				close(stop)
				return
			}
		}
		<-sem
	}
}
