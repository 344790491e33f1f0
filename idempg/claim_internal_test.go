package idempg

import (
	"context"
	"testing"

	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestClaimCommitsAsynchronously runs the claim statement inside an
// explicit transaction, where its effect on synchronous_commit can be
// observed before the commit: off for that transaction, back on after.
func TestClaimCommitsAsynchronously(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.PostgresSchema(t)+"&pool_max_conns=1")
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	defer pool.Close()
	if err := Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	var r claimRow
	if err := tx.QueryRow(ctx, claimSQL, "t", "k", nil, int64(1), int64(1e6), int64(1e6)).Scan(r.dest()...); err != nil || !r.won {
		t.Fatalf("claim: won %v, %v", r.won, err)
	}
	var during, after string
	if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&during); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	if during != "off" || after != "on" {
		t.Fatalf("synchronous_commit during the claim's transaction %q, after %q; want off then on", during, after)
	}
}
