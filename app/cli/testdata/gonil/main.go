// gonil recovers from nil dereferences: Go compiles each into a plain
// load that faults, and its runtime turns the fault into a panic by the
// faulting pc. It prints "2259900 100 100" (TestGoNilChecks).
package main

import "fmt"

type T struct{ a, b, c int }

//go:noinline
func other(x int) int { return x + 1 }

// load has a frame (the call to other), so that the runtime must find
// its caller from the faulting pc to unwind to try's recover.
//
//go:noinline
func load(p *T, k int) int {
	s := other(k) * 3
	s += p.b // faults when p is nil
	return other(s) + k
}

//go:noinline
func try(p *T, k int) (r int, err error) {
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("%v", e)
		}
	}()
	return load(p, k), nil
}

//go:noinline
func load2(p *T, k int) (r int) {
	defer func() {
		if e := recover(); e != nil {
			r = -1
		}
	}()
	s := other(k)
	s += p.c
	return other(s)
}

func main() {
	t := &T{1, 2, 3}
	ok, bad, neg := 0, 0, 0
	for i := 0; i < 1000; i++ {
		var p *T
		if i%10 != 0 {
			p = t
		}
		r, err := try(p, i)
		if err != nil {
			bad++
		} else {
			ok += r
		}
		if v := load2(p, i); v < 0 {
			neg++
		} else {
			ok += v
		}
	}
	fmt.Println(ok, bad, neg)
}
