package idemsql_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemstoretest"
)

// TestConformance runs the shared store suite on each dialect, every case
// of a dialect sharing one database (the suite isolates cases by tenant).
func TestConformance(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		fixture := &idemstoretest.Fixture{
			Store:         env.store,
			Peer:          env.peer,
			BusinessWrite: env.businessWrite,
			BusinessCount: env.businessCount,
		}
		idemstoretest.Exercise(context.Background(), t, func(*testing.T) *idemstoretest.Fixture { return fixture },
			idemstoretest.Capabilities{
				Transactional: true,
				// SQLite's unit of work holds the only write lock from
				// BEGIN IMMEDIATE to commit.
				SingleWriter: env.dialect == idemsql.SQLite,
			})
	})
}
