package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// TestClaimLosesToRowItsSnapshotCannotSee forces the claim's second
// attempt: another transaction inserts the key and holds it uncommitted
// while the claim starts, so the claim's ON CONFLICT waits for it, and
// once it commits, the claim's snapshot (taken before) cannot see the row
// that beat it. The claim must come back lost with that row, not won and
// not empty-handed. Batched claims take the same second attempt.
func TestClaimLosesToRowItsSnapshotCannotSee(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) { testClaimLosesToRowItsSnapshotCannotSee(t, mode.config) })
	}
}

func testClaimLosesToRowItsSnapshotCannotSee(t *testing.T, config *idempg.Config) {
	e := newEnvWith(t, 1, config) // the claim's pool: one connection, whose pid we know
	ctx := context.Background()
	watch := newPool(t, e.url, 1)

	var claimPID int32
	if err := e.pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&claimPID); err != nil {
		t.Fatal(err)
	}
	other, err := e.peer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at)
		VALUES ('t', 'k', 'fp', 'in_flight', 42, now() + interval '1 hour', now() + interval '1 day')`); err != nil {
		t.Fatal(err)
	}

	type answer struct {
		res idem.ClaimResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), Token: 7,
			Lease: time.Minute, Retention: time.Hour})
		done <- answer{res, err}
	}()
	// Wait until the claim is blocked on the uncommitted row (a condition,
	// polled; nothing is asserted about time).
	for {
		var waiting bool
		if err := watch.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`,
			claimPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("claim returned before the other transaction committed: %+v, %v", a.res, a.err)
		case <-time.After(time.Millisecond):
		}
	}
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil {
		t.Fatal(a.err)
	}
	if a.res.Won || a.res.Record == nil || a.res.Record.LeaseToken != 42 || a.res.Record.State != idem.StateInFlight {
		t.Fatalf("claim: %+v (record %+v), want lost to token 42", a.res, a.res.Record)
	}
}
