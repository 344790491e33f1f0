package idemmigrate_test

import (
	"context"
	"database/sql"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/internal/testenv"

	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"
)

// opener returns a function that opens a new *sql.DB on one fresh database
// of dialect each time it is called, like a new process would.
func opener(t *testing.T, dialect idemmigrate.Dialect) func() *sql.DB {
	t.Helper()
	var driver, dsn string
	switch dialect {
	case idemmigrate.Postgres:
		driver, dsn = "pgx", testenv.PostgresSchema(t)
	case idemmigrate.MySQL:
		driver, dsn = "mysql", testenv.MySQLDSN(t)
	case idemmigrate.SQLite:
		// No busy_timeout in the DSN: Migrate must cope on its own.
		driver, dsn = "sqlite", "file:"+filepath.Join(t.TempDir(), "idem.db")
	}
	return func() *sql.DB {
		db, err := sql.Open(driver, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
}

func TestMigrate(t *testing.T) {
	for _, dialect := range idemmigrate.Dialects() {
		t.Run(string(dialect), func(t *testing.T) {
			ctx := context.Background()
			open := opener(t, dialect)

			pending, err := idemmigrate.Pending(ctx, open(), dialect)
			if err != nil {
				t.Fatal(err)
			}
			if len(pending) == 0 || pending[0] != "0001_idem_keys" {
				t.Fatalf("Pending on an empty database = %v, want 0001_idem_keys first", pending)
			}

			// Several processes start at the same instant.
			const processes = 6
			var start, done sync.WaitGroup
			start.Add(1)
			errs := make([]error, processes)
			applied := make([][]string, processes)
			for i := range processes {
				db := open()
				done.Add(1)
				go func() {
					defer done.Done()
					start.Wait()
					if i%2 == 0 {
						errs[i] = idemmigrate.Migrate(ctx, db, dialect)
					} else {
						applied[i], errs[i] = idemmigrate.Apply(ctx, db, dialect)
					}
				}()
			}
			start.Done()
			done.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("process %d: %v", i, err)
				}
			}
			// Each migration is reported applied by the one process that
			// applied it, if that was an Apply: never by two.
			seen := map[string]int{}
			for i, names := range applied {
				for _, n := range names {
					if prev, dup := seen[n]; dup {
						t.Errorf("%s reported applied by processes %d and %d", n, prev, i)
					}
					seen[n] = i
				}
			}

			db := open()
			if pending, err := idemmigrate.Pending(ctx, db, dialect); err != nil || len(pending) != 0 {
				t.Fatalf("Pending after Migrate = %v, %v; want none", pending, err)
			}
			rows, err := db.QueryContext(ctx, "SELECT version, name FROM idem_schema_migrations ORDER BY version")
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			var names []string
			for rows.Next() {
				var v int64
				var name string
				if err := rows.Scan(&v, &name); err != nil {
					t.Fatal(err)
				}
				names = append(names, name)
			}
			if !slices.Equal(names, pending0(t, dialect)) {
				t.Fatalf("recorded migrations %v, want each once: %v", names, pending0(t, dialect))
			}
			if _, err := db.ExecContext(ctx, "SELECT tenant_id, idem_key, expires_at FROM idem_keys"); err != nil {
				t.Fatalf("idem_keys not usable: %v", err)
			}
			// A second run is a no-op.
			if names, err := idemmigrate.Apply(ctx, db, dialect); err != nil || len(names) != 0 {
				t.Fatalf("second Apply = %v, %v; want nothing applied", names, err)
			}
		})
	}
}

// pending0 lists every migration of dialect.
func pending0(t *testing.T, dialect idemmigrate.Dialect) []string {
	t.Helper()
	matches, err := fs.Glob(idemmigrate.Files(dialect), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range matches {
		names = append(names, strings.TrimSuffix(m, ".sql"))
	}
	sort.Strings(names)
	return names
}

// TestSameColumns checks that the three dialects' idem_keys tables have the
// same columns, so that a record means the same thing everywhere.
func TestSameColumns(t *testing.T) {
	ctx := context.Background()
	queries := map[idemmigrate.Dialect]string{
		idemmigrate.Postgres: "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'idem_keys'",
		idemmigrate.MySQL:    "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = 'idem_keys'",
		idemmigrate.SQLite:   "SELECT name FROM pragma_table_info('idem_keys')",
	}
	columns := map[idemmigrate.Dialect][]string{}
	for _, dialect := range idemmigrate.Dialects() {
		db := opener(t, dialect)()
		if err := idemmigrate.Migrate(ctx, db, dialect); err != nil {
			t.Fatalf("%s: %v", dialect, err)
		}
		rows, err := db.QueryContext(ctx, queries[dialect])
		if err != nil {
			t.Fatalf("%s: %v", dialect, err)
		}
		var cols []string
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				t.Fatal(err)
			}
			cols = append(cols, c)
		}
		rows.Close()
		sort.Strings(cols)
		columns[dialect] = cols
	}
	// waiters is no part of a record: it marks the records that duplicates
	// wait for, so that their completion notifies them (LISTEN/NOTIFY,
	// PostgreSQL only).
	want := slices.DeleteFunc(columns[idemmigrate.Postgres], func(c string) bool { return c == "waiters" })
	if len(want) == 0 {
		t.Fatal("postgres idem_keys has no columns")
	}
	for _, dialect := range []idemmigrate.Dialect{idemmigrate.MySQL, idemmigrate.SQLite} {
		if !slices.Equal(columns[dialect], want) {
			t.Errorf("%s idem_keys columns\n %v\nwant (postgres)\n %v", dialect, columns[dialect], want)
		}
	}
}
