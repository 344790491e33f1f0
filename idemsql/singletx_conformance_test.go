package idemsql_test

import (
	"context"
	"github.com/idem-go/idem/internal/testenv"
	"testing"

	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemstoretest"
)

// newSingleTestDB is newTestDB whose two stores run in the
// single-transaction mode.
func newSingleTestDB(t testing.TB, dialect idemsql.Dialect) *testDB {
	t.Helper()
	env := newTestDB(t, dialect)
	env.store = testenv.Must(idemsql.NewStore(env.db, dialect, idemsql.SingleTransaction()))
	env.peer = testenv.Must(idemsql.NewStore(env.peerDB, dialect, idemsql.SingleTransaction()))
	return env
}

// TestSingleTransactionConformance runs the store conformance suite on
// each dialect with stores in the single-transaction mode: the cases that
// go through the engine claim inside the handler's transaction; those
// that call Claim directly see the default mode's claim, which the mode
// keeps for other callers of the table.
func TestSingleTransactionConformance(t *testing.T) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			fixtureOf := func(env *testDB) *idemstoretest.Fixture {
				return &idemstoretest.Fixture{
					Store:         env.store,
					Peer:          env.peer,
					BusinessWrite: env.businessWrite,
					BusinessCount: env.businessCount,
				}
			}
			shared := fixtureOf(newSingleTestDB(t, d))
			newFixture := func(t *testing.T) *idemstoretest.Fixture {
				if d == idemsql.SQLite {
					// Every execution holds SQLite's only write lock from
					// its claim to its commit: cases side by side on one
					// file would wait for each other's held keys. A
					// database per case, as two services would have.
					return fixtureOf(newSingleTestDB(t, d))
				}
				return shared
			}
			idemstoretest.Exercise(context.Background(), t, newFixture,
				idemstoretest.Capabilities{
					Transactional:     true,
					SingleWriter:      d == idemsql.SQLite,
					SingleTransaction: true,
				})
		})
	}
}
