// Package frontends runs the front-end suite against the framework
// adapters (idemgin, idemecho, idemfiber) on transactional stores:
// SQLite and PostgreSQL, the handler's writes committing with its answer
// and rolling back with its failures. A module of its own, so that the
// frameworks reach no other test module.
package frontends

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/idemecho/idemechotest"
	"github.com/idem-go/idem/idemfiber/idemfibertest"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgin/idemgintest"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// frontEnds are the adapters under test, with what each cannot do.
var frontEnds = []struct {
	name     string
	harness  idemfronttest.Harness
	features idemfronttest.Features
}{
	{"gin", idemgintest.Harness, idemfronttest.Features{}},
	{"echo", idemechotest.Harness, idemfronttest.Features{}},
	{"fiber", idemfibertest.Harness{}, idemfibertest.Features},
}

// TestConformanceSQLite gives each case a SQLite file of its own: SQLite
// runs one write transaction at a time, and a case's handler may hold
// one while another case claims.
func TestConformanceSQLite(t *testing.T) {
	for _, fe := range frontEnds {
		t.Run(fe.name, func(t *testing.T) {
			idemfronttest.Exercise(t, fe.harness, fe.features, func(t *testing.T) *idemfronttest.Store {
				db := sqliteDB(t)
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
			})
		})
	}
}

// TestConformancePostgres shares one schema between the cases of a front
// end, each under a tenant of its own, as a deployment shares one
// database.
func TestConformancePostgres(t *testing.T) {
	for _, fe := range frontEnds {
		t.Run(fe.name, func(t *testing.T) {
			pool := pgPool(t)
			store := testenv.Must(idempg.NewStore(pool, nil))
			idemfronttest.Exercise(t, fe.harness, fe.features, func(*testing.T) *idemfronttest.Store {
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

func sqliteDB(t *testing.T) *sql.DB {
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
	return db
}

// pgPool returns a pool on a fresh schema of the shared server, with the
// store's tables and an orders table.
func pgPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8 // the server is shared with every other test run
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
	return pool
}
