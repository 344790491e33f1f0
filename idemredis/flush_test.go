package idemredis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// TestFlushForgets runs concurrent executions through an engine on a
// database of its own, FLUSHDB while every one of them is inside its
// handler, then lets them finish. A flush (or a restart without
// persistence) forgets the records: each in-flight completion must fail
// with ErrLeaseLost, never report a silent success, and the retries after
// the flush run the operation again.
func TestFlushForgets(t *testing.T) {
	ctx := context.Background()
	client := newClient(t, flushDB)
	s := newStoreOn(t, client, testenv.Name())
	e, err := idem.NewEngine(s, nil)
	if err != nil {
		t.Fatal(err)
	}

	const n = 20
	var executions [n]atomic.Int32
	op := func(i int) idem.Operation {
		return idem.Operation{Tenant: "t", Key: fmt.Sprintf("order-%d", i), Fingerprint: []byte("fp")}
	}
	handler := func(i int, inHandler *sync.WaitGroup, proceed chan struct{}) func(context.Context) (idem.Result, error) {
		return func(context.Context) (idem.Result, error) {
			executions[i].Add(1)
			if inHandler != nil {
				inHandler.Done()
				<-proceed
			}
			return idem.Result{Status: 201, Body: []byte(fmt.Sprint(i))}, nil
		}
	}

	b := newBarrier(n)
	var inHandler, wg sync.WaitGroup
	inHandler.Add(n)
	proceed := make(chan struct{})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			b.wait()
			_, errs[i] = e.Do(ctx, op(i), handler(i, &inHandler, proceed))
		})
	}
	b.release()
	inHandler.Wait()
	if err := client.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	close(proceed)
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("execution %d in flight during the flush returned %v, want ErrLeaseLost", i, err)
		}
		if _, err := s.Get(ctx, "t", op(i).Key); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("record %d exists after a refused completion: %v", i, err)
		}
	}

	// The retries find nothing and run again, at the same instant too.
	b = newBarrier(n)
	for i := range n {
		wg.Go(func() {
			b.wait()
			out, err := e.Do(ctx, op(i), handler(i, nil, nil))
			if err != nil || out.Replayed {
				t.Errorf("retry %d after the flush: %+v %v, want a fresh execution", i, out, err)
			}
		})
	}
	b.release()
	wg.Wait()
	for i := range n {
		if got := executions[i].Load(); got != 2 {
			t.Errorf("operation %d ran %d times, want 2 (once before the flush, once after)", i, got)
		}
	}
	// And they are remembered again.
	out, err := e.Do(ctx, op(0), handler(0, nil, nil))
	if err != nil || !out.Replayed {
		t.Fatalf("third call: %+v %v, want a replay", out, err)
	}
}
