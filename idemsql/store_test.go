package idemsql_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/internal/atonce"
)

const (
	// shortLease and shortRetention are waited out by sleeping: the
	// store's clock is the database's, which a test cannot move.
	shortLease     = 200 * time.Millisecond
	shortRetention = 600 * time.Millisecond
	// slack covers timestamp rounding (SQLite keeps milliseconds) and the
	// time between the database stamping a row and the call returning.
	slack = 150 * time.Millisecond
)

func newName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

var nextToken = func() func() int64 {
	var mu sync.Mutex
	var n int64 = time.Now().UnixNano()
	return func() int64 {
		mu.Lock()
		defer mu.Unlock()
		n++
		return n
	}
}()

func claimParams(tenant, key, fp string) idem.ClaimParams {
	var fingerprint []byte
	if fp != "" {
		fingerprint = []byte(fp)
	}
	return idem.ClaimParams{Tenant: tenant, Key: key, Fingerprint: fingerprint, Token: nextToken(),
		Lease: time.Minute, Retention: time.Hour}
}

// atOnce runs fn(0) … fn(n-1) on n goroutines released together by one
// barrier.
var atOnce = atonce.Run

// lostInLease claims p, which must lose to a lease running until heldUntil
// on the database's clock, and reports whether it ran in time to tell. A
// claim that wins before heldUntil fails the test. One that wins after it
// only shows that the machine took longer than the lease between two
// statements: the caller starts over with a longer lease.
func lostInLease(t *testing.T, st idem.Store, p idem.ClaimParams, heldUntil time.Time) bool {
	t.Helper()
	res, err := st.Claim(context.Background(), p)
	if err != nil {
		t.Fatalf("Claim(%q): %v", p.Key, err)
	}
	if !res.Won {
		if res.Record == nil {
			t.Fatalf("Claim(%q) lost without a record", p.Key)
		}
		return true
	}
	if wonAt := mustGet(t, st, p.Tenant, p.Key).CreatedAt; wonAt.Before(heldUntil) {
		t.Fatalf("Claim(%q) won at %v, while the lease ran until %v", p.Key, wonAt, heldUntil)
	}
	t.Logf("Claim(%q) ran after the lease ended (the machine is slow): starting over with a longer lease", p.Key)
	return false
}

// sleepPast sleeps until d has passed, with slack, since at.
func sleepPast(at time.Time, d time.Duration) {
	time.Sleep(time.Until(at.Add(d + slack)))
}

func TestClaimRace(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		const n = 50
		params := make([]idem.ClaimParams, n)
		results := make([]idem.ClaimResult, n)
		errs := make([]error, n)
		for i := range params {
			params[i] = claimParams(tenant, "order-1", "POST /orders")
		}
		atOnce(n, func(i int) {
			st := env.store
			if i%2 == 1 {
				st = env.peer // a second process
			}
			results[i], errs[i] = st.Claim(ctx, params[i])
		})
		winner := -1
		for i, res := range results {
			if errs[i] != nil {
				t.Errorf("claim %d: %v", i, errs[i])
				continue
			}
			if res.Won {
				if winner >= 0 {
					t.Fatalf("claims %d and %d both won", winner, i)
				}
				winner = i
			}
		}
		if winner < 0 {
			t.Fatal("no claim won")
		}
		for i, res := range results {
			if i == winner || errs[i] != nil {
				continue
			}
			if res.Record == nil || res.Record.LeaseToken != params[winner].Token || res.Record.State != idem.StateInFlight {
				t.Errorf("lost claim %d returned %+v, want the winner's in-flight record", i, res.Record)
			}
		}
	})
}

func TestFencing(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		old := claimParams(tenant, "order-1", "fp")
		old.Lease = shortLease
		mustClaim(t, env.store, old, true)
		claimed := time.Now()
		sleepPast(claimed, shortLease)

		taker := claimParams(tenant, "order-1", "fp")
		mustClaim(t, env.peer, taker, true)

		// The execution taken over wakes up, writes and tries to complete.
		business := newName("order")
		tx, err := env.store.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // harmless after Complete
		if err := env.businessWrite(tx.Context(ctx), business); err != nil {
			t.Fatal(err)
		}
		err = tx.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: "order-1", Token: old.Token, Result: idem.Result{Status: 201}})
		if !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("Complete with a stale token = %v, want idem.ErrLeaseLost", err)
		}
		mustCount(t, env, business, 0)
		rec := mustGet(t, env.store, tenant, "order-1")
		if rec.State != idem.StateInFlight || rec.LeaseToken != taker.Token {
			t.Fatalf("record after the refused completion: %+v, want in flight under the taker", rec)
		}
		if err := env.store.Extend(ctx, idem.ExtendParams{Tenant: tenant, Key: "order-1", Token: old.Token, Lease: time.Minute}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("Extend with a stale token = %v, want idem.ErrLeaseLost", err)
		}
		// A stale Release deletes nothing.
		if err := env.store.Release(ctx, idem.ReleaseParams{Tenant: tenant, Key: "order-1", Token: old.Token}); err != nil {
			t.Fatal(err)
		}
		mustGet(t, env.store, tenant, "order-1")
	})
}

func TestTakeover(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		var tenant string
		var first idem.ClaimParams
		var claimed time.Time
		for lease := shortLease; ; lease *= 2 {
			tenant = newName("tenant")
			first = claimParams(tenant, "order-1", "fp-a")
			first.Lease = lease
			mustClaim(t, env.store, first, true)
			claimed = time.Now()
			// Within the lease nobody takes over.
			if lostInLease(t, env.peer, claimParams(tenant, "order-1", "fp-a"), mustGet(t, env.store, tenant, "order-1").LockedUntil) {
				break
			}
		}
		sleepPast(claimed, first.Lease)

		// Past it, another fingerprint still cannot: the key belongs to
		// another request.
		rec := mustClaim(t, env.peer, claimParams(tenant, "order-1", "fp-b"), false)
		if string(rec.Fingerprint) != "fp-a" || rec.LeaseToken != first.Token {
			t.Fatalf("lost claim with another fingerprint returned %+v", rec)
		}
		// No fingerprint matches only no fingerprint.
		mustClaim(t, env.peer, claimParams(tenant, "order-1", ""), false)

		taker := claimParams(tenant, "order-1", "fp-a")
		mustClaim(t, env.peer, taker, true)
		got := mustGet(t, env.store, tenant, "order-1")
		if got.LeaseToken != taker.Token || got.State != idem.StateInFlight {
			t.Fatalf("after takeover: %+v", got)
		}
		if d := got.LockedUntil.Sub(got.CreatedAt); d != taker.Lease {
			t.Errorf("LockedUntil-CreatedAt = %v, want the lease %v", d, taker.Lease)
		}

		// Records without a fingerprint take over each other.
		bare := claimParams(tenant, "order-2", "")
		bare.Lease = shortLease
		mustClaim(t, env.store, bare, true)
		sleepPast(time.Now(), shortLease)
		mustClaim(t, env.peer, claimParams(tenant, "order-2", ""), true)
	})
}

func TestRetention(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		result := idem.Result{Mode: idem.ModeReference, Status: 201, Reference: "order-42",
			Header: map[string][]string{"Location": {"/orders/42"}}}
		var tenant string
		var p idem.ClaimParams
		var claimed time.Time
		for retention := shortRetention; ; retention *= 2 {
			tenant = newName("tenant")
			p = claimParams(tenant, "order-1", "fp-a")
			p.Lease, p.Retention = shortLease, retention
			mustClaim(t, env.store, p, true)
			claimed = time.Now()
			mustComplete(t, env.store, tenant, "order-1", p.Token, result)
			expires := mustGet(t, env.store, tenant, "order-1").ExpiresAt
			res, err := env.peer.Claim(ctx, claimParams(tenant, "order-1", "fp-a"))
			if err != nil {
				t.Fatal(err)
			}
			if !res.Won {
				rec := res.Record
				if rec.State != idem.StateComplete || rec.Result.Reference != "order-42" || rec.Result.Header["Location"][0] != "/orders/42" {
					t.Fatalf("replayed record %+v", rec)
				}
				break
			}
			if wonAt := mustGet(t, env.store, tenant, "order-1").CreatedAt; wonAt.Before(expires) {
				t.Fatalf("a claim won at %v, within the retention of a complete record (until %v)", wonAt, expires)
			}
			t.Logf("the claim ran after the retention ended (the machine is slow): starting over with a longer one")
		}
		sleepPast(claimed, p.Retention)

		// Past retention the key is absent, whatever the fingerprint.
		again := claimParams(tenant, "order-1", "fp-b")
		mustClaim(t, env.peer, again, true)
		got := mustGet(t, env.store, tenant, "order-1")
		if got.State != idem.StateInFlight || got.LeaseToken != again.Token || string(got.Fingerprint) != "fp-b" ||
			got.Result.Status != 0 || got.Result.Reference != "" || got.Result.Header != nil || !got.CompletedAt.IsZero() {
			t.Fatalf("record overwritten past retention still holds the old one: %+v", got)
		}
		if d := got.ExpiresAt.Sub(got.CreatedAt); d != again.Retention {
			t.Errorf("ExpiresAt-CreatedAt = %v, want %v", d, again.Retention)
		}

		// Extend never lets retention end before the lease.
		if err := env.store.Extend(ctx, idem.ExtendParams{Tenant: tenant, Key: "order-1", Token: again.Token, Lease: 2 * again.Retention}); err != nil {
			t.Fatal(err)
		}
		got = mustGet(t, env.store, tenant, "order-1")
		if got.ExpiresAt.Before(got.LockedUntil) {
			t.Errorf("after Extend, retention %v ends before the lease %v", got.ExpiresAt, got.LockedUntil)
		}
	})
}

func TestPurge(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		// Five records that expire, one in flight past its retention
		// but under a live lease, and one that lives on.
		for i := range 5 {
			p := claimParams(tenant, newName("expiring"), "fp")
			p.Lease, p.Retention = shortLease, shortRetention
			mustClaim(t, env.store, p, true)
			if i%2 == 0 {
				mustComplete(t, env.store, tenant, p.Key, p.Token, idem.Result{Status: 200})
			}
		}
		leased := claimParams(tenant, "leased", "fp")
		leased.Lease, leased.Retention = time.Minute, shortRetention
		mustClaim(t, env.store, leased, true)
		kept := claimParams(tenant, "kept", "fp")
		mustClaim(t, env.store, kept, true)
		sleepPast(time.Now(), shortRetention)

		n, err := env.store.Purge(ctx, idem.PurgeParams{Limit: 2})
		if err != nil || n != 2 {
			t.Fatalf("Purge(limit 2) = %d, %v; want 2", n, err)
		}
		n, err = env.peer.Purge(ctx, idem.PurgeParams{})
		if err != nil || n != 3 {
			t.Fatalf("Purge = %d, %v; want the 3 left", n, err)
		}
		mustGet(t, env.store, tenant, "leased")
		mustGet(t, env.store, tenant, "kept")
		if n, err := env.store.Purge(ctx, idem.PurgeParams{}); err != nil || n != 0 {
			t.Fatalf("Purge with nothing expired = %d, %v", n, err)
		}
	})
}

// TestEngine runs idem.Engine.Do over each dialect, with business writes
// racing on one key: the result and the business row commit together or
// not at all.
func TestEngine(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		engines := make([]*idem.Engine, 2)
		for i, st := range []idem.Store{env.store, env.peer} {
			e, err := idem.NewEngine(st, &idem.Config{Heartbeat: -1})
			if err != nil {
				t.Fatal(err)
			}
			engines[i] = e
		}
		op := idem.Operation{Tenant: newName("tenant"), Key: "order-1", Fingerprint: []byte("POST /orders")}
		if tx := idemsql.TxFromContext(ctx); tx != nil {
			t.Fatalf("idemsql.Tx outside an execution = %v, want nil", tx)
		}

		// A failing handler leaves neither the row nor the record.
		failed := newName("order")
		_, err := engines[0].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, failed); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{}, errors.New("payment declined")
		})
		if err == nil || errors.Is(err, idem.ErrStore) {
			t.Fatalf("Do with a failing handler = %v, want the handler's error", err)
		}
		mustCount(t, env, failed, 0)
		if _, err := env.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("Get after a failed run = %v, want idem.ErrNotFound (released)", err)
		}

		// 50 identical operations at once: one runs and commits one row.
		business := newName("order")
		want := idem.Result{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)}
		var mu sync.Mutex
		runs := 0
		const n = 50
		outs := make([]idem.Outcome, n)
		errs := make([]error, n)
		atOnce(n, func(i int) {
			outs[i], errs[i] = engines[i%2].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				mu.Lock()
				runs++
				mu.Unlock()
				return want, env.businessWrite(ctx, business)
			})
		})
		fresh := 0
		for i, err := range errs {
			switch {
			case errors.Is(err, idem.ErrInFlight):
			case err != nil:
				t.Errorf("Do %d: %v", i, err)
			case !outs[i].Replayed:
				fresh++
			case string(outs[i].Result.Body) != `{"id":1}` || outs[i].Result.Header["Content-Type"][0] != "application/json":
				t.Errorf("Do %d replayed %+v", i, outs[i].Result)
			}
		}
		if runs != 1 || fresh != 1 {
			t.Fatalf("fn ran %d times, %d fresh outcomes; want 1", runs, fresh)
		}
		mustCount(t, env, business, 1)
		out, err := engines[1].Do(ctx, op, func(context.Context) (idem.Result, error) {
			t.Error("fn ran after completion")
			return idem.Result{}, nil
		})
		if err != nil || !out.Replayed || out.Result.Status != 201 {
			t.Fatalf("Do after completion = %+v, %v; want a replay", out, err)
		}
	})
}

func mustClaim(t *testing.T, st idem.Store, p idem.ClaimParams, won bool) *idem.Record {
	t.Helper()
	res, err := st.Claim(context.Background(), p)
	if err != nil {
		t.Fatalf("Claim(%q): %v", p.Key, err)
	}
	if res.Won != won {
		t.Fatalf("Claim(%q).Won = %v, want %v (record %+v)", p.Key, res.Won, won, res.Record)
	}
	if !won && res.Record == nil {
		t.Fatalf("Claim(%q) lost without a record", p.Key)
	}
	return res.Record
}

func mustComplete(t *testing.T, st idem.Store, tenant, key string, token int64, res idem.Result) {
	t.Helper()
	ctx := context.Background()
	tx, err := st.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // harmless after Complete
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: token, Result: res}); err != nil {
		t.Fatalf("Complete(%q): %v", key, err)
	}
}

func mustGet(t *testing.T, st idem.Store, tenant, key string) *idem.Record {
	t.Helper()
	rec, err := st.Get(context.Background(), tenant, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return rec
}

func mustCount(t *testing.T, env *testDB, id string, want int) {
	t.Helper()
	n, err := env.businessCount(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if n != want {
		t.Fatalf("business rows %q: %d, want %d", id, n, want)
	}
}

// An expired record that another session holds locked (an operator's
// SELECT … FOR UPDATE, a user transaction still open) is skipped: the
// purge deletes the others at once instead of waiting on it until its lock
// wait times out and undoes the batch, and a claim taking over an expired
// key does not wait behind the purge. SQLite has no row locks.
func TestPurgeSkipsLockedRows(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		if env.dialect == idemsql.SQLite {
			t.Skip("SQLite has no row locks: a writer holds the whole database")
		}
		ctx := context.Background()
		tenant := newName("tenant")
		keys := make([]string, 10)
		for i := range keys {
			keys[i] = fmt.Sprintf("expired-%02d", i)
			p := claimParams(tenant, keys[i], "fp")
			p.Lease, p.Retention = shortLease, shortRetention
			mustClaim(t, env.store, p, true)
		}
		sleepPast(time.Now(), shortRetention)

		locker, err := env.peerDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer locker.Rollback() //nolint:errcheck
		lockSQL := `SELECT 1 FROM idem_keys WHERE tenant_id = ? AND idem_key = ? FOR UPDATE`
		if env.dialect == idemsql.Postgres {
			lockSQL = `SELECT 1 FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2 FOR UPDATE`
		}
		var one int
		if err := locker.QueryRowContext(ctx, lockSQL, tenant, keys[0]).Scan(&one); err != nil {
			t.Fatal(err)
		}

		// Far shorter than any lock wait timeout: a purge that waits on
		// the locked row fails here instead of deleting the nine others.
		quick, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if n, err := env.store.Purge(quick, idem.PurgeParams{Limit: 100}); err != nil || n != 9 {
			t.Fatalf("Purge with one expired row locked elsewhere = %d, %v; want the 9 others", n, err)
		}
		if err := locker.Rollback(); err != nil {
			t.Fatal(err)
		}
		if n, err := env.store.Purge(ctx, idem.PurgeParams{Limit: 100}); err != nil || n != 1 {
			t.Fatalf("Purge once the lock is gone = %d, %v; want 1", n, err)
		}
	})
}
