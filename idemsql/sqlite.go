package idemsql

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go
)

// SQLite settings of OpenSQLite.
const (
	// SQLiteBusyTimeout is how long a statement waits for SQLite's write
	// lock before failing with SQLITE_BUSY, in milliseconds.
	SQLiteBusyTimeout = 10000
	// SQLiteMaxOpenConns is the pool size of OpenSQLite.
	SQLiteMaxOpenConns = 4
)

// OpenSQLite opens (creating it if needed) the SQLite database file at path
// through modernc.org/sqlite, set up for concurrent idempotent requests:
//
//   - WAL journal: readers never wait for the writer, and the writer never
//     waits for readers.
//   - busy_timeout of SQLiteBusyTimeout: a writer waits for the write lock
//     instead of failing at once with SQLITE_BUSY.
//   - _txlock=immediate: every transaction begins with BEGIN IMMEDIATE and
//     so takes the write lock at its start. A deferred transaction would
//     take it at its first write, and two of them reading first could
//     deadlock, which SQLite breaks by failing one with SQLITE_BUSY whatever
//     the busy timeout.
//   - foreign_keys on, as applications expect.
//   - a pool of SQLiteMaxOpenConns connections: SQLite has one writer at a
//     time, so more connections only add waiters polling the busy handler
//     (and risk its timeout), while a few let reads (Get, the read after a
//     lost claim) proceed beside a running transaction. Callers beyond the
//     pool queue in database/sql, in order and without a timeout of their
//     own.
//
// The consequence of a single writer: while a handler runs inside its
// transaction it holds the write lock, and every other write, claims of
// other keys included, waits for it (up to the busy timeout). Keep
// handlers short; for concurrent writers at scale, use PostgreSQL or MySQL.
//
// path must name a file: ":memory:" is refused, since each pooled
// connection would open a database of its own.
func OpenSQLite(path string) (*sql.DB, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, errors.New("idemsql: OpenSQLite needs the path of a database file")
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", SQLiteBusyTimeout))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Set("_txlock", "immediate")
	// A file: URI, so that a path holding '?', '#' or '%' is escaped
	// rather than cut. Its path must be absolute: in file://dir/app.db,
	// "dir" would be read as a host.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("idemsql: OpenSQLite: %w", err)
	}
	dsn := (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(SQLiteMaxOpenConns)
	db.SetMaxIdleConns(SQLiteMaxOpenConns)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
