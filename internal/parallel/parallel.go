// Package parallel runs independent pieces of work on every CPU and hands
// their results back in order, to one goroutine: planning a whole
// kernel's functions on two vCPUs instead of one, while what the results
// feed (a coverage set, a bench's list) stays single-threaded.
package parallel

import (
	"fmt"
	"runtime"
	"sync"
)

// Map calls work(i) for every i in [0, n), on up to GOMAXPROCS goroutines
// at once, and yield(i, result) on the calling goroutine in order of i.
// At most window results (8 per worker) are made ahead of the one being
// yielded, so memory stays bounded when results are big. When yield
// returns false no further work starts, and Map returns once the work
// already running has finished. A panic in work is raised again by Map,
// on the calling goroutine.
//
// work must be safe to call concurrently with itself; yield is never
// called concurrently.
func Map[T any](n int, work func(i int) T, yield func(i int, v T) bool) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			if !yield(i, work(i)) {
				return
			}
		}
		return
	}
	type result struct {
		v     T
		panic any
	}
	window := 8 * workers
	// Index i's result goes to results[i%window]: the feeder hands out i
	// only once i-window has been yielded (a token of sem), so the slot
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
		for i := range n {
			select {
			case sem <- struct{}{}:
			case <-stop:
				return
			}
			select {
			case next <- i:
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
			for i := range next {
				results[i%window] <- func() (r result) {
					defer func() {
						if p := recover(); p != nil {
							r.panic = fmt.Errorf("%v (in parallel work %d)", p, i)
						}
					}()
					return result{v: work(i)}
				}()
			}
		}()
	}
	defer wg.Wait()
	for i := range n {
		r := <-results[i%window]
		if r.panic != nil {
			close(stop)
			panic(r.panic)
		}
		if !yield(i, r.v) {
			close(stop)
			return
		}
		<-sem
	}
}
