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

// TestClaimConcurrent releases 50 claims of one key at one barrier, half
// through each of two clients (two connection pools, as two processes
// would have), and expects exactly one winner; every loser sees the
// winner's in-flight record.
func TestClaimConcurrent(t *testing.T) {
	ctx := context.Background()
	prefix := testenv.Name()
	stores := [2]*Store{
		newStoreOn(t, newClient(t, -1), prefix),
		newStoreOn(t, newClient(t, -1), prefix),
	}
	for round := range 5 {
		const n = 50
		key := "order-" + string(rune('a'+round))
		b := newBarrier(n)
		var wg sync.WaitGroup
		results := make([]idem.ClaimResult, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				b.wait()
				results[i], errs[i] = stores[i%2].Claim(ctx, idem.ClaimParams{
					Tenant: "t", Key: key, Fingerprint: []byte("fp"),
					Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour,
				})
			})
		}
		b.release()
		wg.Wait()

		var winner int64
		for i := range n {
			if errs[i] != nil {
				t.Fatalf("claim %d: %v", i, errs[i])
			}
			if results[i].Won {
				if winner != 0 {
					t.Fatalf("round %d: two winners: tokens %d and %d", round, winner, i+1)
				}
				winner = int64(i + 1)
			}
		}
		if winner == 0 {
			t.Fatalf("round %d: no winner", round)
		}
		for i, r := range results {
			if r.Won {
				continue
			}
			if r.Record == nil || r.Record.LeaseToken != winner || r.Record.State != idem.StateInFlight {
				t.Fatalf("round %d: loser %d saw %+v, want in flight under %d", round, i, r.Record, winner)
			}
		}
	}
}

// TestEngineConcurrent runs 50 identical operations through two engines on
// two clients at one barrier: the function runs once, every other call
// gets ErrInFlight or the replayed result.
func TestEngineConcurrent(t *testing.T) {
	ctx := context.Background()
	prefix := testenv.Name()
	var engines [2]*idem.Engine
	for i := range engines {
		e, err := idem.NewEngine(newStoreOn(t, newClient(t, -1), prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}
	const n = 50
	var executions atomic.Int32
	b := newBarrier(n)
	var wg sync.WaitGroup
	var fresh, replayed, inFlight atomic.Int32
	for i := range n {
		wg.Go(func() {
			b.wait()
			out, err := engines[i%2].Do(ctx, idem.Operation{Tenant: "t", Key: "pay-1", Fingerprint: []byte("same")},
				func(ctx context.Context) (idem.Result, error) {
					executions.Add(1)
					time.Sleep(20 * time.Millisecond) // keep the others meeting it in flight
					return idem.Result{Status: 201, Body: []byte("order 1")}, nil
				})
			switch {
			case errors.Is(err, idem.ErrInFlight):
				inFlight.Add(1)
			case err != nil:
				t.Errorf("Do: %v", err)
			case out.Replayed:
				replayed.Add(1)
				if string(out.Result.Body) != "order 1" {
					t.Errorf("replayed body %q", out.Result.Body)
				}
			default:
				fresh.Add(1)
			}
		})
	}
	b.release()
	wg.Wait()
	if executions.Load() != 1 || fresh.Load() != 1 {
		t.Fatalf("executions=%d fresh=%d, want 1 and 1", executions.Load(), fresh.Load())
	}
	if fresh.Load()+replayed.Load()+inFlight.Load() != n {
		t.Fatalf("fresh=%d replayed=%d inFlight=%d do not add up to %d", fresh.Load(), replayed.Load(), inFlight.Load(), n)
	}
}

// TestClaimFingerprint: a complete or in-flight key claimed with another
// fingerprint is lost and returns the record, so that the engine answers
// 422; nothing is overwritten.
func TestClaimFingerprint(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	claim := func(fp string, token int64) idem.ClaimResult {
		t.Helper()
		r, err := s.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte(fp), Token: token, Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if !claim("a", 1).Won {
		t.Fatal("first claim lost")
	}
	r := claim("b", 2)
	if r.Won || r.Record == nil || string(r.Record.Fingerprint) != "a" || r.Record.LeaseToken != 1 {
		t.Fatalf("claim with another fingerprint: %+v", r)
	}
	e, _ := idem.NewEngine(s, nil)
	_, err := e.Do(ctx, idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("b")}, func(context.Context) (idem.Result, error) {
		t.Error("handler ran on a fingerprint mismatch")
		return idem.Result{}, nil
	})
	if !errors.Is(err, idem.ErrFingerprintMismatch) {
		t.Fatalf("Do with another fingerprint: %v, want ErrFingerprintMismatch", err)
	}
}

// TestTenantsAreSeparate: the same key under two tenants, and tenants that
// would collide under naive concatenation, are distinct records.
func TestTenantsAreSeparate(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	pairs := [][2]string{
		{"a:b", "c"}, {"a", "b:c"}, {"a", "b:c}"}, {"a}", "b:c"},
		{"x", "k"}, {"y", "k"}, {"", "x:k"}, {"%7B", "k"}, {"{", "k"},
	}
	for i, p := range pairs {
		r, err := s.Claim(ctx, idem.ClaimParams{Tenant: p[0], Key: p[1], Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if !r.Won {
			t.Fatalf("tenant %q key %q collided with record %+v", p[0], p[1], r.Record)
		}
	}
	for i, p := range pairs {
		rec, err := s.Get(ctx, p[0], p[1])
		if err != nil {
			t.Fatal(err)
		}
		if rec.Tenant != p[0] || rec.Key != p[1] || rec.LeaseToken != int64(i+1) {
			t.Fatalf("Get(%q, %q) = %+v", p[0], p[1], rec)
		}
	}
}
