package idemhttp_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
)

// The front-end suite on transactional stores: the handler's writes
// commit with its answer and roll back with its failures.

// TestConformanceSQLite gives each case a SQLite file of its own: SQLite
// runs one write transaction at a time, and a case's handler may hold
// one while another case claims.
func TestConformanceSQLite(t *testing.T) {
	idemfronttest.Exercise(t, idemhttptest.Harness{}, idemfronttest.Features{}, func(t *testing.T) *idemfronttest.Store {
		e := newSQLiteEnv(t)
		return &idemfronttest.Store{
			Store: e.store,
			BusinessWrite: func(ctx context.Context, id string) error {
				_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, id)
				return err
			},
			BusinessCount: func(ctx context.Context, id string) (n int, err error) {
				err = e.db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE item = ?`, id).Scan(&n)
				return n, err
			},
		}
	})
}

// TestConformancePostgres shares one schema between the cases, each under
// a tenant of its own, as a real deployment shares one database: one pool
// for all, on a server other tests use too.
func TestConformancePostgres(t *testing.T) {
	pg := newPGEnv(t)
	idemfronttest.Exercise(t, idemhttptest.Harness{}, idemfronttest.Features{}, func(*testing.T) *idemfronttest.Store {
		return &idemfronttest.Store{
			Store: pg.store,
			BusinessWrite: func(ctx context.Context, id string) error {
				_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (item) VALUES ($1)`, id)
				return err
			},
			BusinessCount: func(ctx context.Context, id string) (n int, err error) {
				err = pg.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE item = $1`, id).Scan(&n)
				return n, err
			},
		}
	})
}

// The problems that say what became of the work say "rolled back" here.
func TestProblemTextsFollowTheStore(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) {
		idemhttptest.CheckProblemTexts(t, func(t *testing.T) idem.Store { return newSQLiteEnv(t).store })
	})
	t.Run("postgresql", func(t *testing.T) {
		idemhttptest.CheckProblemTexts(t, func(t *testing.T) idem.Store { return newPGEnv(t).store })
	})
}
