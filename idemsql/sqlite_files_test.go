package idemsql_test

import (
	"context"
	"errors"
	"github.com/idem-go/idem/internal/testenv"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// TestSQLiteFilesTakeTheDatabaseMode: every file beside a database created
// 0600 is 0600 once idem has used it, steps recorded, failed and taken
// over included: idem creates no file of its own (SQLite's -wal and -shm
// take the database file's mode), so step results never sit in a file
// others may read.
func TestSQLiteFilesTakeTheDatabaseMode(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "app.db")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	db, err := idemsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := idemmigrate.Migrate(ctx, db, idemsql.SQLite.MigrateDialect()); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE business (id TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	engine := newEngine(t, testenv.Must(idemsql.NewStore(db, idemsql.SQLite)), nil)
	op := idem.Operation{Tenant: "acme", Key: "pay-1", Fingerprint: []byte("POST /pay")}
	failure := errors.New("failed after the charge")
	var steps stepCounter
	for _, want := range []error{failure, nil} {
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if _, err := idem.Step(ctx, "charge", steps.charge); err != nil {
				return idem.Result{}, err
			}
			if _, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO business (id) VALUES ('x')`); err != nil {
				return idem.Result{}, err
			}
			// Refused: the transaction holds the lock.
			if _, err := idem.Step(ctx, "late", steps.charge); !errors.Is(err, idemsql.ErrStepAfterStatement) {
				t.Errorf("a step after the write = %v, want ErrStepAfterStatement", err)
			}
			return idem.Result{Status: 201}, want
		})
		if !errors.Is(err, want) {
			t.Fatalf("Do = %v, want %v", err, want)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 2 {
		t.Fatalf("files %v: want the database and its WAL at least", entries)
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		if mode := info.Mode(); mode.Perm() != 0o600 || mode&fs.ModeType != 0 {
			t.Errorf("%s beside a 0600 database has mode %v, want -rw-------", e.Name(), mode)
		}
	}
}
