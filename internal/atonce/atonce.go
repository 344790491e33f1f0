// Package atonce releases goroutines together, for tests that must send
// duplicates at the same instant: duplicates sent one after the other
// prove nothing, since the first finishes before the second looks.
package atonce

import "sync"

// Run runs fn(0) … fn(n-1) on n goroutines that all wait at one barrier
// and are released together, and returns when every one has returned. fn
// runs off the test goroutine, so it must not call t.Fatal: record what
// happened and check it after Run returns.
func Run(n int, fn func(i int)) {
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			fn(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
}
