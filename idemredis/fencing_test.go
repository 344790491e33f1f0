package idemredis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

// leaseParams claims key for 300ms, the short lease the takeover tests
// sleep past.
func leaseParams(key string, fp string, token int64) idem.ClaimParams {
	return idem.ClaimParams{Tenant: "t", Key: key, Fingerprint: []byte(fp), Token: token, Lease: 300 * time.Millisecond, Retention: time.Hour}
}

// TestFencing: after a takeover the old token can no longer extend,
// release or complete; the new one can.
func TestFencing(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if r, err := s.Claim(ctx, leaseParams("k", "fp", 1)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	// A valid lease is not taken over, even with the same fingerprint (a
	// long lease of its own, so that a slow machine cannot end it).
	long := leaseParams("long", "fp", 1)
	long.Lease = time.Minute
	if r, err := s.Claim(ctx, long); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	long.Token = 2
	if r, err := s.Claim(ctx, long); err != nil || r.Won || r.Record.LeaseToken != 1 {
		t.Fatalf("claim under a valid lease: %+v %v", r, err)
	}
	time.Sleep(400 * time.Millisecond)
	// An expired lease with another fingerprint is not taken over either.
	if r, err := s.Claim(ctx, leaseParams("k", "other", 3)); err != nil || r.Won {
		t.Fatalf("takeover with another fingerprint: %+v %v", r, err)
	}
	if r, err := s.Claim(ctx, leaseParams("k", "fp", 4)); err != nil || !r.Won {
		t.Fatalf("takeover: %+v %v", r, err)
	}

	tx, _ := s.Begin(ctx)
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with the old token: %v, want ErrLeaseLost", err)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("extend with the old token: %v, want ErrLeaseLost", err)
	}
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 1}); err != nil {
		t.Fatalf("release with the old token: %v", err)
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil || rec.LeaseToken != 4 || rec.State != idem.StateInFlight {
		t.Fatalf("after the old token's calls: %+v %v", rec, err)
	}

	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 4, Lease: time.Minute}); err != nil {
		t.Fatalf("extend: %v", err)
	}
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 4, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	// Complete records are never taken over, whatever their lease says.
	time.Sleep(400 * time.Millisecond)
	if r, err := s.Claim(ctx, leaseParams("k", "fp", 5)); err != nil || r.Won || r.Record.State != idem.StateComplete {
		t.Fatalf("claim of a complete record: %+v %v", r, err)
	}
	// Nor released, nor extended.
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 4}); err != nil {
		t.Fatal(err)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 4, Lease: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("extend of a complete record: %v, want ErrLeaseLost", err)
	}
	if rec, err := s.Get(ctx, "t", "k"); err != nil || rec.State != idem.StateComplete {
		t.Fatalf("after release of a complete record: %+v %v", rec, err)
	}
}

// TestConcurrentTakeover: 50 executions meet an expired lease at one
// barrier, on two clients; exactly one takes it over.
func TestConcurrentTakeover(t *testing.T) {
	ctx := context.Background()
	prefix := testenv.Name()
	stores := [2]*Store{newStoreOn(t, newClient(t, -1), prefix), newStoreOn(t, newClient(t, -1), prefix)}
	if r, err := stores[0].Claim(ctx, leaseParams("k", "fp", 1000)); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	time.Sleep(400 * time.Millisecond)

	const n = 50
	b := newBarrier(n)
	var wg sync.WaitGroup
	var winners atomic.Int32
	for i := range n {
		wg.Go(func() {
			b.wait()
			// A long lease for the takeovers: a short one could expire
			// again before the last claimant arrives on a loaded machine,
			// and a second takeover would then be right.
			p := leaseParams("k", "fp", int64(i+1))
			p.Lease = time.Minute
			r, err := stores[i%2].Claim(ctx, p)
			if err != nil {
				t.Error(err)
				return
			}
			if r.Won {
				winners.Add(1)
			}
		})
	}
	b.release()
	wg.Wait()
	if got := winners.Load(); got != 1 {
		t.Fatalf("%d executions took the expired lease over, want 1", got)
	}
}

// TestEngineLeaseLost: a handler outliving its 300ms lease (heartbeat
// off) is taken over by a retry; the retry's result is stored and the slow
// execution's completion is refused with ErrLeaseLost.
func TestEngineLeaseLost(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	e, err := idem.NewEngine(s, &idem.Config{Lease: 300 * time.Millisecond, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Tenant: "t", Key: "slow", Fingerprint: []byte("fp")}
	started := make(chan struct{})
	proceed := make(chan struct{})
	slowErr := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, op, func(context.Context) (idem.Result, error) {
			close(started)
			<-proceed
			return idem.Result{Status: 201, Body: []byte("slow")}, nil
		})
		slowErr <- err
	}()
	<-started
	time.Sleep(400 * time.Millisecond)
	out, err := e.Do(ctx, op, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 201, Body: []byte("retry")}, nil
	})
	if err != nil || out.Replayed || string(out.Result.Body) != "retry" {
		t.Fatalf("retry after the lease: %+v %v", out, err)
	}
	close(proceed)
	if err := <-slowErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("slow execution: %v, want ErrLeaseLost", err)
	}
	rec, err := s.Get(ctx, "t", "slow")
	if err != nil || string(rec.Result.Body) != "retry" {
		t.Fatalf("stored: %+v %v", rec, err)
	}
}

// TestEngineHeartbeat: with the heartbeat on, a handler that runs past
// its 1s lease keeps its key: a concurrent retry meets it in
// flight and does not run.
func TestEngineHeartbeat(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	e, err := idem.NewEngine(s, &idem.Config{Lease: time.Second, Heartbeat: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Tenant: "t", Key: "long", Fingerprint: []byte("fp")}
	started := make(chan struct{})
	proceed := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(ctx, op, func(context.Context) (idem.Result, error) {
			close(started)
			<-proceed
			return idem.Result{Status: 201}, nil
		})
		done <- err
	}()
	<-started
	time.Sleep(1500 * time.Millisecond)
	_, err = e.Do(ctx, op, func(context.Context) (idem.Result, error) {
		t.Error("retry ran while the first execution was alive")
		return idem.Result{}, nil
	})
	if !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("retry during a heartbeat-kept lease: %v, want ErrInFlight", err)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatalf("long execution: %v", err)
	}
}
