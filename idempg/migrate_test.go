package idempg_test

import (
	"context"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5/stdlib"
)

// A database migrated by an earlier release (0001 and 0002, no steps
// column, no waiters) and holding records moves forward with Migrate: the
// steps and waiters migrations are pending, then applied once, and the
// records written before them are claimed, taken over, given steps and
// waited on like any other.
func TestMigrateAddsStepsToEarlierSchema(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	db := stdlib.OpenDBFromPool(e.pool)
	defer db.Close()
	// Back to the schema of the earlier release.
	complete, err := fs.ReadFile(idemmigrate.Files(idemmigrate.Postgres), "0002_idem_complete.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, string(complete)+`; ALTER TABLE idem_keys DROP COLUMN steps;
		ALTER TABLE idem_keys DROP COLUMN waiters;
		DROP FUNCTION idem_notify_token(text, text); DROP TABLE idem_notify_secret;
		DELETE FROM idem_schema_migrations WHERE version >= 3`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pool.Exec(ctx, `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token, locked_until, expires_at)
		VALUES ('t', 'old', 'fp', 'in_flight', 7, now() - interval '1 second', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	pending, err := idemmigrate.Pending(ctx, db, idemmigrate.Postgres)
	if err != nil || !slices.Equal(pending, []string{"0003_idem_steps", "0004_idem_waiters", "0005_idem_notify_token", "0006_idem_keys_list"}) {
		t.Fatalf("pending on the earlier schema: %v, %v; want 0003_idem_steps, 0004_idem_waiters, 0005_idem_notify_token, 0006_idem_keys_list", pending, err)
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
	changed, stop := watch(t, e.other, "t", "old")
	defer stop()
	completeIn(t, e.store, idem.ClaimParams{Tenant: "t", Key: "old", Token: 8})
	mustClose(t, changed, "completion of a record written before the migration")
}
