package idemstoretest

import "github.com/idem-go/idem/internal/atonce"

// atOnce runs fn(0) … fn(n-1) on n goroutines released together by one
// barrier (see atonce.Run).
func atOnce(n int, fn func(i int)) { atonce.Run(n, fn) }
