package idemsqlite_test

import (
	"database/sql"
	"os"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/idemsql/idemsqlite"
)

func TestOpenSettings(t *testing.T) {
	// A path that a plain DSN would cut at '?' or '#'.
	path := filepath.Join(t.TempDir(), "odd name?x=1#frag%20.db")
	db, err := idemsqlite.Open(path)
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
	if mode != "wal" || busy != idemsqlite.BusyTimeout || fk != 1 {
		t.Fatalf("journal_mode %q, busy_timeout %d, foreign_keys %d; want wal, %d, 1", mode, busy, fk, idemsqlite.BusyTimeout)
	}
	// A relative path is relative to the working directory.
	dir := t.TempDir()
	t.Chdir(dir)
	rel, err := idemsqlite.Open(filepath.Join("sub", "..", "rel.db"))
	if err != nil {
		t.Fatal(err)
	}
	rel.Close()
	if _, err := os.Stat(filepath.Join(dir, "rel.db")); err != nil {
		t.Fatalf("relative path: %v", err)
	}

	for _, bad := range []string{"", ":memory:", "file:x.db"} {
		if db, err := idemsqlite.Open(bad); err == nil {
			db.Close()
			t.Errorf("Open(%q) succeeded, want an error", bad)
		}
	}
}

func TestOpenWithSynchronous(t *testing.T) {
	for _, tc := range []struct {
		setting string
		want    int
	}{{"", 2}, {"NORMAL", 1}, {"normal", 1}, {"FULL", 2}, {"EXTRA", 3}} {
		db, err := idemsqlite.OpenWith(filepath.Join(t.TempDir(), "s.db"), &idemsqlite.Options{Synchronous: tc.setting})
		if err != nil {
			t.Fatal(err)
		}
		// Every pooled connection has it, not only the first.
		conns := make([]*sql.Conn, idemsqlite.MaxOpenConns)
		for i := range conns {
			if conns[i], err = db.Conn(t.Context()); err != nil {
				t.Fatal(err)
			}
			var got int
			if err := conns[i].QueryRowContext(t.Context(), `PRAGMA synchronous`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Synchronous %q: connection %d has synchronous %d, want %d", tc.setting, i, got, tc.want)
			}
		}
		for _, c := range conns {
			c.Close()
		}
		db.Close()
	}
	for _, bad := range []string{"OFF", "0", "fast"} {
		if db, err := idemsqlite.OpenWith(filepath.Join(t.TempDir(), "s.db"), &idemsqlite.Options{Synchronous: bad}); err == nil {
			db.Close()
			t.Errorf("Synchronous %q accepted, want an error", bad)
		}
	}
}
