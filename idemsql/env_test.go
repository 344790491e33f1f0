package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"

	_ "github.com/jackc/pgx/v5/stdlib"
)

// testDB is one fresh, migrated database of a dialect, reached through two
// *sql.DB handles as two processes would, with a business table beside
// idem_keys.
type testDB struct {
	dialect     idemsql.Dialect
	dsn         string // what openDB takes, for helper processes
	db, peerDB  *sql.DB
	store, peer *idemsql.Store
}

var dialects = []idemsql.Dialect{idemsql.SQLite, idemmysql.Dialect, idemsql.Postgres}

// testConns is the pool size of each handle on a server database.
const testConns = 16

// forEachDialect runs fn as a parallel subtest per dialect, each on a
// fresh database. The tests mostly wait out leases on the database clock,
// so running them side by side costs little CPU and saves much time.
func forEachDialect(t *testing.T, fn func(t *testing.T, env *testDB)) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			fn(t, newTestDB(t, d))
		})
	}
}

func newTestDB(t testing.TB, dialect idemsql.Dialect) *testDB {
	t.Helper()
	var dsn string
	switch dialect {
	case idemsql.SQLite:
		dsn = filepath.Join(t.TempDir(), "idem.db")
	case idemmysql.Dialect:
		dsn = testenv.MySQLDSN(t)
	case idemsql.Postgres:
		dsn = testenv.PostgresSchema(t)
	}
	return newTestDBAt(t, dialect, dsn)
}

// newTestDBAt is newTestDB on the database dsn names.
func newTestDBAt(t testing.TB, dialect idemsql.Dialect, dsn string) *testDB {
	t.Helper()
	return newTestDBWith(t, dialect, dsn, func() (*sql.DB, error) { return openDB(dialect, dsn) })
}

// newTestDBWith is newTestDBAt with the handles opened by openHandle.
func newTestDBWith(t testing.TB, dialect idemsql.Dialect, dsn string, openHandle func() (*sql.DB, error)) *testDB {
	t.Helper()
	open := func() *sql.DB {
		db, err := openHandle()
		if err != nil {
			t.Fatal(err)
		}
		if dialect != idemsql.SQLite {
			// The servers are shared with other packages' tests (and
			// PostgreSQL allows 100 clients): enough connections for
			// races that overlap at the server, and kept for the next
			// race rather than reopened.
			db.SetMaxOpenConns(testConns)
			db.SetMaxIdleConns(testConns)
		}
		return db
	}
	env := &testDB{dialect: dialect, dsn: dsn, db: open(), peerDB: open()}
	t.Cleanup(func() {
		env.db.Close()
		env.peerDB.Close()
	})
	ctx := context.Background()
	if err := idemmigrate.Migrate(ctx, env.db, dialect.MigrateDialect()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := env.db.ExecContext(ctx, `CREATE TABLE business (id VARCHAR(255) NOT NULL)`); err != nil {
		t.Fatalf("create business table: %v", err)
	}
	env.store = testenv.Must(idemsql.NewStore(env.db, dialect))
	env.peer = testenv.Must(idemsql.NewStore(env.peerDB, dialect))
	return env
}

// openDB opens a handle on the database of dialect named by dsn (a file
// path for SQLite).
func openDB(dialect idemsql.Dialect, dsn string) (*sql.DB, error) {
	switch dialect {
	case idemsql.SQLite:
		return idemsqlite.Open(dsn)
	case idemmysql.Dialect:
		return sql.Open("mysql", dsn)
	case idemsql.Postgres:
		return sql.Open("pgx", dsn)
	}
	return nil, fmt.Errorf("unknown dialect %v", dialect)
}

func sqlOpen(t testing.TB, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// placeholder returns the dialect's first parameter.
func (e *testDB) placeholder() string {
	if e.dialect == idemsql.Postgres {
		return "$1"
	}
	return "?"
}

// businessWrite inserts a business row through the handler's transaction.
func (e *testDB) businessWrite(ctx context.Context, id string) error {
	tx := idemsql.TxFromContext(ctx)
	if tx == nil {
		return fmt.Errorf("idemsql.TxFromContext(ctx) is nil")
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO business (id) VALUES (`+e.placeholder()+`)`, id)
	return err
}

// businessCount counts the committed business rows tagged id.
func (e *testDB) businessCount(ctx context.Context, id string) (int, error) {
	var n int
	err := e.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM business WHERE id = `+e.placeholder(), id).Scan(&n)
	return n, err
}
