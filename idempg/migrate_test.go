package idempg_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5/stdlib"
)

// A database migrated by an earlier release (0001 and 0002, no steps
// column) and holding records moves forward with Migrate: the steps
// migration is pending, then applied once, and the records written before
// it are claimed, taken over and given steps like any other.
func TestMigrateAddsStepsToEarlierSchema(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(e.pool)
	defer db.Close()
	// Back to the schema of the earlier release.
	if _, err := e.pool.Exec(ctx, `ALTER TABLE idem_keys DROP COLUMN steps;
		DELETE FROM idem_schema_migrations WHERE version >= 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at)
		VALUES ('t', 'old', 'fp', 'in_flight', 7, now() - interval '1 second', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	pending, err := idemmigrate.Pending(ctx, db, idemmigrate.Postgres)
	if err != nil || !slices.Equal(pending, []string{"0003_idem_steps"}) {
		t.Fatalf("pending on the earlier schema: %v, %v; want 0003_idem_steps", pending, err)
	}
	if err := idempg.Migrate(ctx, e.pool); err != nil {
		t.Fatal(err)
	}
	if pending, err := idemmigrate.Pending(ctx, db, idemmigrate.Postgres); err != nil || len(pending) != 0 {
		t.Fatalf("pending after Migrate: %v, %v", pending, err)
	}
	res := mustClaim(t, e.store, idem.ClaimParams{Tenant: "t", Key: "old", Fingerprint: []byte("fp"), Token: 8, Lease: time.Hour, Retention: time.Hour})
	if !res.Won || !res.Takeover || res.Steps != nil {
		t.Fatalf("takeover of a record written before the migration: %+v", res)
	}
	saveStep(t, e.store, "old", 8, "charge", `"ch_1"`)
	if rec, err := e.store.Get(ctx, "t", "old"); err != nil || stepsText(rec.Steps) != `charge="ch_1";` {
		t.Fatalf("record: %+v, %v", rec, err)
	}
}
