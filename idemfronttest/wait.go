package idemfronttest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemfront"
)

// waiters is how many duplicates wait for one execution.
const waiters = 10

// wait: with the wait mode, duplicates that meet the execution in flight
// wait for it and get its answer replayed, instead of "retry later".
func (s *suite) wait(t *testing.T) {
	t.Run("DuplicatesGetTheAnswer", func(t *testing.T) {
		if s.f.NoWait {
			t.Skip("skipping: the front end has no wait mode (Features.NoWait)")
		}
		t.Parallel()
		g := newGate()
		e := s.newEnv(t, Options{WaitInFlight: time.Minute}, func(ctx context.Context, _ []byte) Response {
			g.wait(ctx)
			return Response{Body: []byte("worth the wait")}
		}, g)
		first := make(chan Reply, 1)
		go func() {
			r, err := e.client.Send(context.WithoutCancel(t.Context()), e.call("k", "a"))
			if err != nil {
				t.Errorf("first call: %v", err)
			}
			first <- r
		}()
		g.waitStarted(t)
		replies := make([]Reply, waiters)
		var wg sync.WaitGroup
		for i := range waiters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if replies[i], err = e.client.Send(t.Context(), e.call("k", "a")); err != nil {
					t.Errorf("waiter %d: %v", i, err)
				}
			}()
		}
		// Each waiter's claim lost to the execution in flight: without the
		// wait mode it would have been answered by now.
		for e.store.lost.Load() < waiters {
			time.Sleep(time.Millisecond)
		}
		g.release()
		wg.Wait()
		wantAnswer(t, "the first call", <-first, idemfront.Executed, []byte("worth the wait"))
		for i, r := range replies {
			wantAnswer(t, fmt.Sprintf("waiter %d", i), r, idemfront.Replayed, []byte("worth the wait"))
		}
		e.wantRuns(1, "one execution, waited for")
	})
}
