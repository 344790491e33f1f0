package idempg_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/atonce"
)

// atOnce runs fn(0) … fn(n-1) on n goroutines released together by one
// barrier.
var atOnce = atonce.Run

func TestClaimOneWinnerAtOnce(t *testing.T) {
	e := newEnv(t, 5)
	ctx := context.Background()
	const n = 50
	type answer struct {
		res idem.ClaimResult
		err error
	}
	answers := make([]answer, n)
	atOnce(n, func(i int) {
		store := e.store
		if i%2 == 1 {
			store = e.other // half of them through the second "process"
		}
		res, err := store.Claim(ctx, idem.ClaimParams{
			Tenant: "t", Key: "k", Fingerprint: []byte("fp"),
			Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour,
		})
		answers[i] = answer{res, err}
	})
	var winner int64
	for i, a := range answers {
		if a.err != nil {
			t.Fatalf("claim %d: %v", i, a.err)
		}
		if a.res.Won {
			if winner != 0 {
				t.Fatalf("two winners: tokens %d and %d", winner, i+1)
			}
			winner = int64(i + 1)
		}
	}
	if winner == 0 {
		t.Fatal("no winner")
	}
	for i, a := range answers {
		if a.res.Won {
			continue
		}
		rec := a.res.Record
		if rec == nil || rec.State != idem.StateInFlight || rec.LeaseToken != winner || string(rec.Fingerprint) != "fp" {
			t.Fatalf("loser %d got record %+v, want the winner's in-flight record (token %d)", i, rec, winner)
		}
	}
}

// TestEngineOneEffectAtOnce sends 50 identical operations at the same
// instant through two engines on two pools: exactly one business write,
// and every other caller gets either "in flight" or the replay.
func TestEngineOneEffectAtOnce(t *testing.T) {
	e := newEnv(t, 5)
	ctx := context.Background()
	engines := [2]*idem.Engine{mustEngine(t, e.store), mustEngine(t, e.other)}
	const n = 50
	var ran, replayed, inFlight atomic.Int32
	errs := make([]error, n)
	atOnce(n, func(i int) {
		out, err := engines[i%2].Do(ctx, idem.Operation{Tenant: "t", Key: "order-1", Fingerprint: []byte("fp")},
			func(ctx context.Context) (idem.Result, error) {
				ran.Add(1)
				return idem.Result{Status: 201, Body: []byte("created")}, insertOrder(ctx, "order-1")
			})
		switch {
		case errors.Is(err, idem.ErrInFlight):
			inFlight.Add(1)
		case err != nil:
			errs[i] = err
		case out.Replayed:
			replayed.Add(1)
			if string(out.Result.Body) != "created" {
				errs[i] = errors.New("replay with another body: " + string(out.Result.Body))
			}
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	if got := ran.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
	if got := e.countOrders(t, "order-1"); got != 1 {
		t.Fatalf("%d business rows, want 1", got)
	}
	if replayed.Load()+inFlight.Load() != n-1 {
		t.Fatalf("replayed %d + in flight %d, want %d", replayed.Load(), inFlight.Load(), n-1)
	}
}

func mustEngine(t testing.TB, s idem.Store) *idem.Engine {
	t.Helper()
	eng, err := idem.NewEngine(s, &idem.Config{Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// TestClaimReplayIsARead checks the claim's guard: a key that is held is
// answered without locking its row, so replays write nothing (xmax stays
// 0: no row lock, no transaction id, no WAL).
func TestClaimReplayIsARead(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	claim := idem.ClaimParams{Tenant: "t", Key: "k", Token: 7, Lease: time.Minute, Retention: time.Hour}
	if res, err := e.store.Claim(ctx, claim); err != nil || !res.Won {
		t.Fatalf("first claim: %+v, %v", res, err)
	}
	complete(t, e.store, idem.CompleteParams{Tenant: "t", Key: "k", Token: 7, Result: idem.Result{Status: 200}})
	for i := range 3 {
		claim.Token = int64(100 + i)
		res, err := e.other.Claim(ctx, claim)
		if err != nil || res.Won || res.Record.State != idem.StateComplete || res.Record.LeaseToken != 7 {
			t.Fatalf("replay claim: %+v, %v", res, err)
		}
	}
	var xmax string
	if err := e.pool.QueryRow(ctx, `SELECT xmax::text FROM idem_keys WHERE idem_key = 'k'`).Scan(&xmax); err != nil {
		t.Fatal(err)
	}
	if xmax != "0" {
		t.Fatalf("xmax = %s after replays: a replay claim locked the row", xmax)
	}
}

func TestClaimTakeoverAndRetention(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	claim := func(key string, token int64, fp string, lease, retention time.Duration) idem.ClaimResult {
		t.Helper()
		res, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: key, Fingerprint: []byte(fp),
			Token: token, Lease: lease, Retention: retention})
		if err != nil {
			t.Fatalf("claim %s/%d: %v", key, token, err)
		}
		return res
	}
	if !claim("lease", 1, "a", time.Millisecond, time.Hour).Won || !claim("ret", 1, "a", time.Hour, time.Millisecond).Won {
		t.Fatal("fresh claims lost")
	}
	complete(t, e.store, idem.CompleteParams{Tenant: "t", Key: "ret", Token: 1})
	time.Sleep(20 * time.Millisecond) // past both short durations, on the server's clock too

	if res := claim("lease", 2, "b", time.Hour, time.Hour); res.Won || res.Record.LeaseToken != 1 {
		t.Fatalf("takeover with another fingerprint: %+v, want lost to token 1", res)
	}
	if !claim("lease", 3, "a", time.Hour, time.Hour).Won {
		t.Fatal("takeover of an expired lease with the same fingerprint lost")
	}
	if !claim("ret", 4, "z", time.Hour, time.Hour).Won {
		t.Fatal("claim of a record past retention lost")
	}
	rec, err := e.store.Get(ctx, "t", "ret")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateInFlight || rec.LeaseToken != 4 || string(rec.Fingerprint) != "z" || !rec.CompletedAt.IsZero() || rec.Result.Status != 0 {
		t.Fatalf("record after reclaim kept the old one's fields: %+v", rec)
	}
}

func TestGetExtendRelease(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	if _, err := e.store.Get(ctx, "t", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get of no record: %v, want ErrNotFound", err)
	}
	if _, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Second, Retention: time.Second}); err != nil {
		t.Fatal(err)
	}
	before, _ := e.store.Get(ctx, "t", "k")
	if err := e.other.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Hour}); err != nil {
		t.Fatalf("extend: %v", err)
	}
	after, _ := e.store.Get(ctx, "t", "k")
	if !after.LockedUntil.After(before.LockedUntil) || after.ExpiresAt.Before(after.LockedUntil) {
		t.Fatalf("extend: lease %v→%v, retention %v", before.LockedUntil, after.LockedUntil, after.ExpiresAt)
	}
	if err := e.store.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 2, Lease: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("extend with another token: %v, want ErrLeaseLost", err)
	}
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 2}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Get(ctx, "t", "k"); err != nil {
		t.Fatalf("release with another token deleted the record: %v", err)
	}
	if err := e.store.Release(ctx, idem.ReleaseParams{Tenant: "t", Key: "k", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.store.Get(ctx, "t", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get after release: %v, want ErrNotFound", err)
	}
}

// complete stores p's result through a unit of work with no business
// write.
func complete(t testing.TB, s *idempg.Store, p idem.CompleteParams) {
	t.Helper()
	ctx := context.Background()
	tx, err := s.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := tx.Complete(ctx, p); err != nil {
		t.Fatalf("complete: %v", err)
	}
}
