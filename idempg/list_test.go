package idempg_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/idempg"
)

// TestKeyStatsSamplesLargeTables checks the sampled overview of a table
// past the exact threshold: marked Estimated, every tenant found, counts
// near the truth, and the oldest record in flight found through the
// expires_at index rather than the sample.
func TestKeyStatsSamplesLargeTables(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	// 20,000 records of two tenants, 1 in 100 in flight; the oldest in
	// flight claimed an hour before the others.
	_, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, state, lease_token, locked_until, created_at, completed_at, expires_at)
SELECT 'tenant-' || (i % 2), 'k' || i, CASE WHEN i % 100 = 0 THEN 'in_flight' ELSE 'complete' END, i,
    now() + interval '1 hour', c, CASE WHEN i % 100 = 0 THEN NULL ELSE c END, c + interval '1 day'
FROM generate_series(1, 20000) AS i, LATERAL (SELECT now() - CASE WHEN i = 5000 THEN interval '2 hours' ELSE interval '1 minute' END AS c) t`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `ANALYZE idem_keys`); err != nil {
		t.Fatal(err)
	}
	defer idempg.SetStatsSampling(1000, 5000)()
	st, err := e.store.KeyStats(ctx, idemkeys.StatsParams{})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Estimated {
		t.Fatal("KeyStats of a table past the threshold is not marked Estimated")
	}
	if len(st.Tenants) != 2 {
		t.Fatalf("sampled tenants: %+v, want both", st.Tenants)
	}
	total, complete := 0, 0
	for _, tc := range st.Tenants {
		total += tc.Total()
		complete += tc.Complete
	}
	// A sample of pages: within a third of the truth.
	if total < 20000*2/3 || total > 20000*4/3 || complete < total*9/10 {
		t.Errorf("sampled counts: %d records, %d complete; want about 20000, 99%% complete", total, complete)
	}
	if st.OldestInFlight == nil || st.OldestInFlight.Key != "k5000" {
		t.Errorf("oldest in flight: %+v, want k5000", st.OldestInFlight)
	}
	exact, err := e.store.KeyStats(ctx, idemkeys.StatsParams{Tenant: "tenant-0"})
	if err != nil {
		t.Fatal(err)
	}
	if exact.Estimated || len(exact.Tenants) != 1 || exact.Tenants[0].Total() != 10000 || exact.Tenants[0].InFlight != 200 {
		t.Errorf("one tenant's KeyStats: %+v estimated=%v, want exactly 10000 with 200 in flight (every multiple of 100 is even)", exact.Tenants, exact.Estimated)
	}
}
