package idemstoretest

import "sync"

// atOnce runs fn(0) … fn(n-1) on n goroutines that all wait at one barrier
// and are released together, and returns when every one has returned.
// Duplicates sent one after the other prove nothing; these arrive at the
// same instant. fn must not call t.Fatal (it runs off the test goroutine):
// record what happened and check it after atOnce returns.
func atOnce(n int, fn func(i int)) {
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
