package idemsql_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/idemstoretest"
)

// TestConformance runs the shared store suite on each dialect, every case
// of a dialect sharing one database (the suite isolates cases by tenant).
func TestConformance(t *testing.T) {
	forEachDialect(t, conformance)
}

// TestConformanceSQLiteNormal runs the suite on SQLite with synchronous =
// NORMAL (idemsqlite.Options), where the claim of a new key runs as a
// statement prepared on the pool rather than on a connection of its own.
func TestConformanceSQLiteNormal(t *testing.T) {
	t.Parallel()
	dsn := filepath.Join(t.TempDir(), "idem.db")
	conformance(t, newTestDBWith(t, idemsql.SQLite, dsn, func() (*sql.DB, error) {
		return idemsqlite.OpenWith(dsn, &idemsqlite.Options{Synchronous: "NORMAL"})
	}))
}

// conformance runs the shared store suite on env.
func conformance(t *testing.T, env *testDB) {
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
}
