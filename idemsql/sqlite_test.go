package idemsql_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

func TestOpenSQLiteSettings(t *testing.T) {
	// A path that a plain DSN would cut at '?' or '#'.
	path := filepath.Join(t.TempDir(), "odd name?x=1#frag%20.db")
	db, err := idemsql.OpenSQLite(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not created at the given path: %v", err)
	}
	var mode string
	var busy, fk int
	row := db.QueryRow(`SELECT (SELECT journal_mode FROM pragma_journal_mode), (SELECT timeout FROM pragma_busy_timeout), (SELECT foreign_keys FROM pragma_foreign_keys)`)
	if err := row.Scan(&mode, &busy, &fk); err != nil {
		t.Fatal(err)
	}
	if mode != "wal" || busy != idemsql.SQLiteBusyTimeout || fk != 1 {
		t.Fatalf("journal_mode %q, busy_timeout %d, foreign_keys %d; want wal, %d, 1", mode, busy, fk, idemsql.SQLiteBusyTimeout)
	}
	// A relative path is relative to the working directory.
	dir := t.TempDir()
	t.Chdir(dir)
	rel, err := idemsql.OpenSQLite(filepath.Join("sub", "..", "rel.db"))
	if err != nil {
		t.Fatal(err)
	}
	rel.Close()
	if _, err := os.Stat(filepath.Join(dir, "rel.db")); err != nil {
		t.Fatalf("relative path: %v", err)
	}

	for _, bad := range []string{"", ":memory:", "file:x.db"} {
		if db, err := idemsql.OpenSQLite(bad); err == nil {
			db.Close()
			t.Errorf("OpenSQLite(%q) succeeded, want an error", bad)
		}
	}
}

// TestSQLiteNoBusy runs many executions at once on several keys, from two
// handles on one file as two processes would: with WAL, the busy timeout
// and BEGIN IMMEDIATE, every one waits its turn and none sees SQLITE_BUSY.
func TestSQLiteNoBusy(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	engines := make([]*idem.Engine, 2)
	for i, st := range []idem.Store{env.store, env.peer} {
		e, err := idem.NewEngine(st, &idem.Config{Heartbeat: -1})
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}
	tenant := newName("tenant")
	const keys, perKey = 8, 12
	var runs atomic.Int32
	errs := make([]error, keys*perKey)
	atOnce(keys*perKey, func(i int) {
		key := fmt.Sprintf("order-%d", i%keys)
		op := idem.Operation{Tenant: tenant, Key: key}
		_, errs[i] = engines[i%2].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			runs.Add(1)
			return idem.Result{Status: 201}, env.businessWrite(ctx, tenant+key)
		})
	})
	for i, err := range errs {
		if err != nil && !errors.Is(err, idem.ErrInFlight) {
			t.Errorf("Do %d: %v", i, err)
		}
	}
	if n := runs.Load(); n != keys {
		t.Fatalf("%d runs for %d keys", n, keys)
	}
	for k := range keys {
		mustCount(t, env, fmt.Sprintf("%sorder-%d", tenant, k), 1)
	}
}
