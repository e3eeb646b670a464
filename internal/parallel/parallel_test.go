package parallel

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestMapInOrder(t *testing.T) {
	for _, procs := range []int{1, 2, 4} {
		old := runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, 7, 1000} {
			var got []int
			Map(n, func(i int) int {
				if i%7 == 0 {
					time.Sleep(time.Microsecond) // finish out of order
				}
				return i * i
			}, func(i, v int) bool {
				if v != i*i {
					t.Errorf("procs %d: yield(%d, %d), want %d", procs, i, v, i*i)
				}
				got = append(got, i)
				return true
			})
			if len(got) != n {
				t.Errorf("procs %d, n %d: %d yields", procs, n, len(got))
			}
			for k, i := range got {
				if k != i {
					t.Fatalf("procs %d: yield %d was of %d: out of order", procs, k, i)
				}
			}
		}
		runtime.GOMAXPROCS(old)
	}
}

func TestMapStops(t *testing.T) {
	old := runtime.GOMAXPROCS(4)
	defer runtime.GOMAXPROCS(old)
	var started, running, most atomic.Int32
	yields := 0
	Map(100000, func(i int) int {
		started.Add(1)
		r := running.Add(1)
		for {
			m := most.Load()
			if r <= m || most.CompareAndSwap(m, r) {
				break
			}
		}
		defer running.Add(-1)
		return i
	}, func(i, v int) bool {
		yields++
		return i < 9
	})
	if yields != 10 {
		t.Errorf("%d yields after yield said stop at the 10th", yields)
	}
	// Work runs at most a window (8 groups a worker) ahead of yield.
	if s := started.Load(); s > (1+8*4)*group {
		t.Errorf("%d started; want at most %d (a group yielded and a window of 32 groups)", s, (1+8*4)*group)
	}
	if r := running.Load(); r != 0 {
		t.Errorf("%d still running after Map returned", r)
	}
	if m := most.Load(); m > 4 {
		t.Errorf("%d ran at once; want at most GOMAXPROCS (4)", m)
	}
}

func TestMapPanics(t *testing.T) {
	old := runtime.GOMAXPROCS(2)
	defer runtime.GOMAXPROCS(old)
	defer func() {
		p := recover()
		if p == nil || !strings.Contains(p.(error).Error(), "boom") {
			t.Errorf("recovered %v; want the work's panic", p)
		}
	}()
	Map(100, func(i int) int {
		if i == 42 {
			panic("boom")
		}
		return i
	}, func(int, int) bool { return true })
	t.Error("Map returned after a panic in work")
}

func TestFor(t *testing.T) {
	for _, procs := range []int{1, 2, 4} {
		old := runtime.GOMAXPROCS(procs)
		for _, n := range []int{0, 1, 17, 1000} {
			got := make([]int32, n)
			var running, most atomic.Int32
			For(n, func(i int) {
				r := running.Add(1)
				for {
					m := most.Load()
					if r <= m || most.CompareAndSwap(m, r) {
						break
					}
				}
				atomic.AddInt32(&got[i], 1)
				running.Add(-1)
			})
			for i, c := range got {
				if c != 1 {
					t.Fatalf("procs %d, n %d: work(%d) ran %d times", procs, n, i, c)
				}
			}
			if m := most.Load(); int(m) > procs {
				t.Errorf("procs %d: %d ran at once", procs, m)
			}
		}
		runtime.GOMAXPROCS(old)
	}
	func() {
		old := runtime.GOMAXPROCS(2)
		defer runtime.GOMAXPROCS(old)
		defer func() {
			if p := recover(); p == nil || !strings.Contains(p.(error).Error(), "boom") {
				t.Errorf("recovered %v; want the work's panic", p)
			}
		}()
		For(100, func(i int) {
			if i == 42 {
				panic("boom")
			}
		})
		t.Error("For returned after a panic in work")
	}()
}
