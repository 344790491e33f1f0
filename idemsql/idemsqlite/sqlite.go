// Package idemsqlite opens SQLite databases for idemsql through
// modernc.org/sqlite (pure Go, no cgo), set up for concurrent idempotent
// requests:
//
//	db, err := idemsqlite.Open("app.db")
//	…
//	store, err := idemsql.NewStore(db, idemsql.SQLite)
//
// It is a package of its own so that programs on MySQL or PostgreSQL do
// not link the SQLite driver.
package idemsqlite

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver, pure Go
)

// Settings of Open.
const (
	// BusyTimeout is how long a statement waits for SQLite's write lock
	// before failing with SQLITE_BUSY ("database is locked"), in
	// milliseconds. idemsql's Store, which queues its own writers, gives up
	// on a turn that long without the lock changing hands.
	BusyTimeout = 10000
	// MaxOpenConns is the pool size of Open.
	MaxOpenConns = 4
)

// Open opens (creating it if needed) the SQLite database file at path
// through modernc.org/sqlite:
//
//   - WAL journal: readers never wait for the writer, and the writer never
//     waits for readers.
//   - busy_timeout of BusyTimeout: a writer waits for the write lock
//     instead of failing at once with SQLITE_BUSY. Between processes on
//     one file, that is how writers take turns; within one process,
//     idemsql's Store queues its writers itself.
//   - _txlock=immediate: transactions begun through database/sql
//     (db.BeginTx) begin with BEGIN IMMEDIATE and so take the write lock
//     at their start. A deferred transaction takes it at its first write,
//     and fails with SQLITE_BUSY at once, whatever the busy timeout, if
//     another connection wrote since it first read. (idemsql begins the
//     handler's transaction IMMEDIATE itself.)
//   - foreign_keys on, as applications expect.
//   - a pool of MaxOpenConns connections: SQLite has one writer at a time,
//     so more connections only add waiters, while a few let reads (the
//     read after a lost claim, the application's own) proceed beside a
//     running transaction. Callers beyond the pool queue in database/sql,
//     without a timeout of their own.
//
// path must name a file: ":memory:" is refused, since each pooled
// connection would open a database of its own.
//
// Open leaves SQLite's synchronous setting at its default, FULL: every
// commit waits for the disk. OpenWith sets it otherwise.
func Open(path string) (*sql.DB, error) {
	return OpenWith(path, nil)
}

// Options are the settings of OpenWith beyond Open's.
type Options struct {
	// Synchronous is SQLite's synchronous setting (PRAGMA synchronous)
	// on every connection: "FULL" (the default, also when empty), "EXTRA"
	// or "NORMAL". In WAL mode, NORMAL commits without waiting for the
	// disk, which is flushed at checkpoints only: a crash of the process
	// loses nothing, a power loss or a crash of the machine can lose the
	// last commits (never the database's consistency). Use it where the
	// records may be lost with the machine, as a proxy's may, whose
	// upstream commits its own writes elsewhere.
	Synchronous string
}

// OpenWith is Open with the settings of o (nil for Open's).
func OpenWith(path string, o *Options) (*sql.DB, error) {
	if path == "" || path == ":memory:" || strings.HasPrefix(path, "file:") {
		return nil, errors.New("idemsqlite: Open needs the path of a database file")
	}
	q := url.Values{}
	q.Add("_pragma", fmt.Sprintf("busy_timeout(%d)", BusyTimeout))
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	if o != nil && o.Synchronous != "" {
		// Not OFF: with it even the checkpoints do not wait for the
		// disk, and a power loss can corrupt the file.
		switch sync := strings.ToUpper(o.Synchronous); sync {
		case "NORMAL", "FULL", "EXTRA":
			q.Add("_pragma", "synchronous("+sync+")")
		default:
			return nil, fmt.Errorf("idemsqlite: Options.Synchronous must be NORMAL, FULL or EXTRA, got %q", o.Synchronous)
		}
	}
	q.Set("_txlock", "immediate")
	// A file: URI, so that a path holding '?', '#' or '%' is escaped
	// rather than cut. Its path must be absolute: in file://dir/app.db,
	// "dir" would be read as a host.
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: Open: %w", err)
	}
	dsn := (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}).String()
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(MaxOpenConns)
	db.SetMaxIdleConns(MaxOpenConns)
	if err := db.Ping(); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}
