// Package rpcfront runs the front-end suite against idemgrpc and
// idemconnect on transactional stores (SQLite and PostgreSQL): the
// handler's writes, through the context, commit with its answer and roll
// back with its failures, as over HTTP.
package rpcfront

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/idemconnect/idemconnecttest"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgrpc/idemgrpctest"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// harnesses are the RPC front ends, each over its real transport.
var harnesses = map[string]struct {
	h idemfronttest.Harness
	f idemfronttest.Features
}{
	"grpc":         {idemgrpctest.Harness{}, idemgrpctest.Features},
	"connect":      {idemconnecttest.Harness{Protocol: idemconnecttest.Connect}, idemconnecttest.Features},
	"connect-grpc": {idemconnecttest.Harness{Protocol: idemconnecttest.GRPC}, idemconnecttest.Features},
}

// sqliteStore gives each case a SQLite file of its own: SQLite runs one
// write transaction at a time.
func sqliteStore(t *testing.T) *idemfronttest.Store {
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

func TestConformanceSQLite(t *testing.T) {
	for name, h := range harnesses {
		t.Run(name, func(t *testing.T) { idemfronttest.Exercise(t, h.h, h.f, sqliteStore) })
	}
}

// TestConformancePostgres shares one schema between the cases, each
// under a tenant of its own.
func TestConformancePostgres(t *testing.T) {
	cfg, err := pgxpool.ParseConfig(testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4 // the server is shared with every other test run
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
	store := testenv.Must(idempg.NewStore(pool, nil))
	for name, h := range harnesses {
		t.Run(name, func(t *testing.T) {
			idemfronttest.Exercise(t, h.h, h.f, func(*testing.T) *idemfronttest.Store {
				return &idemfronttest.Store{
					Store: store,
					BusinessWrite: func(ctx context.Context, id string) error {
						_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, id)
						return err
					},
					BusinessCount: func(ctx context.Context, id string) (n int, err error) {
						err = pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE item = $1`, id).Scan(&n)
						return n, err
					},
				}
			})
		})
	}
}
