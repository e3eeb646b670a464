// gogrow recurses on new goroutines with frames large enough that their
// stacks grow many times: each growth calls runtime.morestack from the
// function's stack check and runs the function again from its start.
// grow runs exactly 8×200×201 = 321,600 times (TestGoStackGrowth).
package main

import (
	"fmt"
	"sync"
)

//go:noinline
func grow(d int) byte {
	var buf [256]byte
	buf[d%256] = byte(d)
	if d == 0 {
		return buf[0]
	}
	return grow(d-1) + buf[d%256]
}

func main() {
	var wg sync.WaitGroup
	sums := make([]int, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				sums[g] += int(grow(200))
			}
		}()
	}
	wg.Wait()
	fmt.Println(sums[0])
}
