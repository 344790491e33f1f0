package idemsql_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/internal/testenv"
)

// TestMySQLSessionSettings claims, takes over and completes under DSN
// settings that change how MySQL reads times and runs assignments: the
// store must not depend on them.
func TestMySQLSessionSettings(t *testing.T) {
	base, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	setup := sqlOpen(t, "mysql", base.FormatDSN())
	defer setup.Close()
	if err := idemmigrate.Migrate(ctx, setup, idemmigrate.MySQL); err != nil {
		t.Fatal(err)
	}
	var version, mode string
	if err := setup.QueryRow(`SELECT VERSION(), @@SESSION.sql_mode`).Scan(&version, &mode); err != nil {
		t.Fatal(err)
	}

	variants := map[string]func(c *mysql.Config){
		"parseTime off": func(c *mysql.Config) { c.ParseTime = false },
		"loc far east":  func(c *mysql.Config) { c.Loc = time.FixedZone("UTC+13", 13*3600) },
		"session time zone": func(c *mysql.Config) {
			c.Params = map[string]string{"time_zone": "'-07:00'"}
		},
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		// MariaDB can run UPDATE assignments on the old row, the SQL
		// standard way, instead of left to right.
		variants["simultaneous assignment"] = func(c *mysql.Config) {
			c.Params = map[string]string{"sql_mode": "'" + mode + ",SIMULTANEOUS_ASSIGNMENT'"}
		}
	}
	for name, change := range variants {
		t.Run(name, func(t *testing.T) {
			cfg := base.Clone()
			change(cfg)
			connector, err := mysql.NewConnector(cfg)
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(connector)
			defer db.Close()
			st := idemsql.New(db, idemsql.MySQL)
			checkLifecycle(t, st)
		})
	}
}

// checkLifecycle claims, loses, takes over, completes and replays one key.
func checkLifecycle(t *testing.T, st *idemsql.Store) {
	t.Helper()
	ctx := context.Background()
	tenant := newName("tenant")
	first := claimParams(tenant, "order-1", "fp")
	first.Lease = shortLease
	mustClaim(t, st, first, true)
	claimed := time.Now()
	rec := mustGet(t, st, tenant, "order-1")
	if d := rec.LockedUntil.Sub(rec.CreatedAt); d != first.Lease {
		t.Fatalf("LockedUntil-CreatedAt = %v, want %v", d, first.Lease)
	}
	// The database's UTC clock and this process's agree to well within
	// an hour: a time read in the wrong zone would be hours off.
	if skew := time.Since(rec.CreatedAt); skew > time.Hour || skew < -time.Hour {
		t.Fatalf("CreatedAt %v is %v away from now: read in the wrong time zone", rec.CreatedAt, skew)
	}
	mustClaim(t, st, claimParams(tenant, "order-1", "fp"), false)
	sleepPast(claimed, shortLease)
	mustClaim(t, st, claimParams(tenant, "order-1", "other"), false)
	taker := claimParams(tenant, "order-1", "fp")
	mustClaim(t, st, taker, true)
	got := mustGet(t, st, tenant, "order-1")
	if got.LeaseToken != taker.Token || got.State != idem.StateInFlight || !got.LockedUntil.After(rec.LockedUntil) {
		t.Fatalf("after takeover: %+v (before: %+v)", got, rec)
	}
	mustComplete(t, st, tenant, "order-1", taker.Token, idem.Result{Status: 201, Body: []byte("ok")})
	done := mustClaim(t, st, claimParams(tenant, "order-1", "fp"), false)
	if done.State != idem.StateComplete || string(done.Result.Body) != "ok" || done.CompletedAt.Before(done.CreatedAt) {
		t.Fatalf("replay: %+v", done)
	}
	if err := st.Extend(ctx, idem.ExtendParams{Tenant: tenant, Key: "order-1", Token: taker.Token, Lease: time.Minute}); err == nil {
		t.Fatal("Extend of a complete record succeeded")
	}
}

// TestMySQLTenantLength checks that a tenant the table cannot hold is
// refused, never truncated into another tenant's key space.
func TestMySQLTenantLength(t *testing.T) {
	env := newTestDB(t, idemsql.MySQL)
	long := strings.Repeat("t", 512)
	mustClaim(t, env.store, claimParams(long, "order-1", ""), true)
	if rec := mustGet(t, env.store, long, "order-1"); rec.Tenant != long {
		t.Fatalf("tenant read back as %d bytes", len(rec.Tenant))
	}
	if _, err := env.store.Claim(context.Background(), claimParams(long+"x", "order-1", "")); err == nil {
		t.Fatal("a 513-byte tenant was claimed")
	}
}
