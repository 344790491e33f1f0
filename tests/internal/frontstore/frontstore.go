// Package frontstore gives the front-end suite (idemfronttest) its
// transactional stores, for the test modules that run it on SQLite and
// PostgreSQL (tests/frontends for the framework adapters, tests/rpcfront
// for the RPC front ends): a store, and an orders table that the suite's
// handler writes through the store's transaction and counts around it.
// A module of its own, so that neither test module reaches the other's
// dependencies.
package frontstore

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// SQLite returns a store on a SQLite file of the test's own: SQLite runs
// one write transaction at a time, and a case's handler may hold one
// while another case claims, so each case takes one.
func SQLite(t *testing.T) *idemfronttest.Store {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(t.Context(), db, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &idemfronttest.Store{
		Store: testenv.Must(idemsql.NewStore(db, idemsql.SQLite)),
		BusinessWrite: func(ctx context.Context, id string) error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, id)
			return err
		},
		BusinessCount: func(ctx context.Context, id string) (n int, err error) {
			err = db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE item = ?`, id).Scan(&n)
			return n, err
		},
	}
}

// Postgres opens one pool of at most maxConns connections (the server is
// shared with every other test run) on a fresh schema of the shared
// server, with the store's tables and an orders table, and returns what
// idemfronttest.Exercise takes: every case gets the one store over it, as
// a deployment shares one database, each case under a tenant of its own.
func Postgres(t *testing.T, maxConns int32) func(*testing.T) *idemfronttest.Store {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store := idemfronttest.Store{
		Store: testenv.Must(idempg.NewStore(pool, nil)),
		BusinessWrite: func(ctx context.Context, id string) error {
			_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, id)
			return err
		},
		BusinessCount: func(ctx context.Context, id string) (n int, err error) {
			err = pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE item = $1`, id).Scan(&n)
			return n, err
		},
	}
	return func(*testing.T) *idemfronttest.Store {
		s := store // each case its own copy of the fixture, over the one pool
		return &s
	}
}
