package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// Store is an idem.Store on a database/sql database. The tables come from
// idemmigrate (Dialect.MigrateDialect). A Store is safe for concurrent use.
// Build one per database and share it: on SQLite, the Store queues its
// own writers (see the package documentation).
type Store struct {
	db *sql.DB
	d  *dialect

	// SQLite only: writes lets one writer of this Store at a time at the
	// database; busyLimit is how long a writer waits there while the lock
	// does not change hands (the busy timeout of the database's
	// connections, read once; 0 until read).
	writes    *gate
	busyLimit atomic.Int64
	// SQLite only: the synchronous setting a claim of a new key restores
	// after committing without waiting for the disk, read once: 0
	// unknown, -1 claims commit as everything else (not in WAL mode, or
	// already not synchronous), or the setting (2 FULL, 3 EXTRA).
	claimSync atomic.Int32

	// stmts holds the statements prepared on db (see prepared), by text.
	stmts sync.Map

	// MySQL only: whether InnoDB rolls the whole transaction back on a
	// lock wait timeout (innodb_rollback_on_timeout), read once: 0
	// unknown, 1 no, 2 yes.
	rollbackOnTimeout atomic.Int32

	// MySQL only: whether the server is MariaDB, which runs compound
	// statements (see mariadb.go), read once: 0 unknown, 1 no, 2 yes.
	mariaDB atomic.Int32

	// watch holds the subscriptions of Watch.
	watch watchers

	// single is set in the single-transaction mode (see singletx.go).
	single *singleMode
}

// lease names one execution's hold on a key.
type lease struct {
	tenant, key string
	token       int64
}

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.StepStore = (*Store)(nil)
)

// Info implements idem.Store: the dialect ("postgresql", "mysql" or
// "sqlite"), transactional.
func (s *Store) Info() idem.StoreInfo {
	return idem.StoreInfo{Name: s.d.storeName, Transactional: true, SingleTransaction: s.single != nil}
}

// NewStore returns a Store on db, which speaks dialect (idemsql.SQLite,
// idemsql.Postgres or idemmysql.Dialect). The tables must exist: run
// idemmigrate first. The options choose a mode other than the default
// (SingleTransaction).
func NewStore(db *sql.DB, dialect Dialect, opts ...Option) (*Store, error) {
	if dialect.d == nil {
		return nil, errors.New("idemsql: NewStore needs a dialect: idemsql.SQLite, idemsql.Postgres or idemmysql.Dialect")
	}
	if db == nil {
		return nil, errors.New("idemsql: NewStore needs a *sql.DB")
	}
	s := &Store{db: db, d: dialect.d}
	if s.d.oneWriter {
		s.writes = newGate()
	}
	for _, opt := range opts {
		opt(s)
	}
	return s, nil
}

// DB returns the database the store works on.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return Dialect{s.d} }

// Begin implements idem.Store. It takes no connection: the transaction
// begins at the handler's first statement through TxFromContext(ctx) (or
// DB(ctx, db)), and a handler that makes none completes with a single
// statement. On SQLite the transaction begins IMMEDIATE, taking the write
// lock at its first statement, a read included.
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	return newUnit(s), nil
}

// Get implements idem.Store. It reads the record whatever its state or
// retention, its recovery points included.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	rec, stored, err := s.read(ctx, s.d.get, tenant, key)
	if err != nil {
		if errors.Is(err, idem.ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("idemsql: get: %w", err)
	}
	if rec.Steps, err = decodeSteps(stored); err != nil {
		return nil, fmt.Errorf("idemsql: get: %w", err)
	}
	return rec, nil
}

// retry runs fn again, after a short random pause, when it failed with an
// error after which the statement did nothing and may simply run again
// (dialect.retryable): an InnoDB deadlock, SQLite's busy.
func (s *Store) retry(ctx context.Context, fn func() error) error {
	for attempt := 1; ; attempt++ {
		err := fn()
		if err == nil || !s.d.retryable(err) || attempt == s.d.retryAttempts() {
			return err
		}
		// The two sides of a deadlock would meet again if they retried
		// in step.
		pause := time.Duration(rand.Int64N(int64(attempt) * int64(5*time.Millisecond)))
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// prepared returns q prepared on the Store's pool, once for the Store's
// life; database/sql prepares it again on each connection that runs it,
// once. Where preparing fails, it returns a statement that prepares at
// each run, as a plain query does.
func (s *Store) prepared(ctx context.Context, q query) preparedStmt {
	if st, ok := s.stmts.Load(q.text); ok {
		return st.(*sql.Stmt)
	}
	st, err := s.db.PrepareContext(ctx, q.text)
	if err != nil {
		return unprepared{s.db, q.text}
	}
	if prev, loaded := s.stmts.LoadOrStore(q.text, st); loaded {
		st.Close()
		return prev.(*sql.Stmt)
	}
	return st
}

// preparedStmt is a *sql.Stmt, or a query run as is (unprepared).
type preparedStmt interface {
	ExecContext(ctx context.Context, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, args ...any) *sql.Row
}

type unprepared struct {
	db   *sql.DB
	text string
}

func (u unprepared) ExecContext(ctx context.Context, args ...any) (sql.Result, error) {
	return u.db.ExecContext(ctx, u.text, args...)
}

func (u unprepared) QueryContext(ctx context.Context, args ...any) (*sql.Rows, error) {
	return u.db.QueryContext(ctx, u.text, args...)
}

func (u unprepared) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	return u.db.QueryRowContext(ctx, u.text, args...)
}

// execer is what runs a statement: a *sql.DB, *sql.Conn or *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// nullBytes stores an empty fingerprint or body as NULL, which reads back
// as nil: idem treats nil and empty alike.
func nullBytes(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}
