package idempg_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestPurgeWhileClaiming fills the table with expired records, purges them
// in bounded batches while claims keep being served on both pools, and
// checks that the purge deleted exactly the expired records, none of the
// live ones, and that claims completed while it ran. 100k expired rows by
// default, 10k under -short.
func TestPurgeWhileClaiming(t *testing.T) {
	expired := 100_000
	if testing.Short() {
		expired = 10_000
	}
	const liveComplete, liveLease = 1_000, 100
	e := newEnv(t, 4)
	ctx := context.Background()

	// Expired: complete records past retention, and in-flight records past
	// both retention and lease (every tenth). Live: complete records within
	// retention, and in-flight records past retention whose lease still
	// runs (a handler outliving its retention before its heartbeat).
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, state, lease_token, locked_until, completed_at, created_at, expires_at)
		SELECT 'old', 'k' || i, CASE WHEN i % 10 = 0 THEN 'in_flight' ELSE 'complete' END, i,
			now() - interval '2 days', now() - interval '2 days', now() - interval '2 days', now() - interval '1 day' + i * interval '1 microsecond'
		FROM generate_series(1, $1) AS i`, expired); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, state, lease_token, locked_until, created_at, expires_at)
		SELECT 'live', 'c' || i, 'complete', i, now(), now(), now() + interval '1 day' FROM generate_series(1, $1) AS i
		UNION ALL
		SELECT 'live', 'l' || i, 'in_flight', i, now() + interval '1 hour', now() - interval '2 days', now() - interval '1 day' FROM generate_series(1, $2) AS i`,
		liveComplete, liveLease); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `ANALYZE idem_keys`); err != nil {
		t.Fatal(err)
	}

	var purging atomic.Bool
	var claimsDuring atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var claimed sync.Map
	claimErrs := make(chan error, 4)
	for g := range 4 {
		store := e.store
		if g%2 == 1 {
			store = e.other
		}
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				began := purging.Load()
				key := fmt.Sprintf("g%d-%d", g, i)
				res, err := store.Claim(ctx, idem.ClaimParams{Tenant: "new", Key: key, Token: 1, Lease: time.Minute, Retention: time.Hour})
				if err != nil || !res.Won {
					claimErrs <- fmt.Errorf("claim %s: %+v, %v", key, res, err)
					return
				}
				claimed.Store(key, true)
				if began && purging.Load() {
					claimsDuring.Add(1)
				}
			}
		})
	}

	purging.Store(true)
	deleted, batches := 0, 0
	for {
		n, err := e.store.Purge(ctx, idem.PurgeParams{Limit: 1000})
		if err != nil {
			t.Fatalf("purge: %v", err)
		}
		deleted += n
		batches++
		if n < 1000 {
			break
		}
	}
	purging.Store(false)
	close(stop)
	wg.Wait()
	close(claimErrs)
	for err := range claimErrs {
		t.Fatal(err)
	}

	t.Logf("purged %d records in %d batches; %d claims completed during the purge", deleted, batches, claimsDuring.Load())
	if deleted != expired {
		t.Fatalf("purge deleted %d records, want exactly the %d expired ones", deleted, expired)
	}
	if claimsDuring.Load() == 0 {
		t.Fatal("no claim completed while the purge ran: claims were blocked behind it")
	}
	var old, live, fresh int
	if err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE tenant_id = 'old'), count(*) FILTER (WHERE tenant_id = 'live'),
		count(*) FILTER (WHERE tenant_id = 'new') FROM idem_keys`).Scan(&old, &live, &fresh); err != nil {
		t.Fatal(err)
	}
	nClaimed := 0
	claimed.Range(func(any, any) bool { nClaimed++; return true })
	if old != 0 || live != liveComplete+liveLease || fresh != nClaimed {
		t.Fatalf("after purge: %d expired left (want 0), %d live (want %d), %d claimed (want %d)",
			old, live, liveComplete+liveLease, fresh, nClaimed)
	}
}

// TestPurgeDefaultLimit: a zero limit means idem's documented 1000.
func TestPurgeDefaultLimit(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, state, lease_token, locked_until, expires_at)
		SELECT 't', 'k' || i, 'complete', i, now(), now() - interval '1 second' FROM generate_series(1, 1500) AS i`); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int{1000, 500, 0} {
		if n, err := e.store.Purge(ctx, idem.PurgeParams{}); err != nil || n != want {
			t.Fatalf("purge: %d, %v; want %d", n, err, want)
		}
	}
}
