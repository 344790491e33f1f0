package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// defaultPurgeLimit is the batch of Purge when PurgeParams.Limit is zero.
const defaultPurgeLimit = 1000

// claimAttempts bounds the retries of a claim whose record vanished
// between the claim and the read that follows a lost claim (released or
// purged in between): the next attempt normally wins.
const claimAttempts = 3

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

	// MySQL only: whether InnoDB rolls the whole transaction back on a
	// lock wait timeout (innodb_rollback_on_timeout), read once: 0
	// unknown, 1 no, 2 yes.
	rollbackOnTimeout atomic.Int32

	// watch holds the subscriptions of Watch.
	watch watchers
}

// lease names one execution's hold on a key.
type lease struct {
	tenant, key string
	token       int64
}

var _ idem.Store = (*Store)(nil)

// Info implements idem.Store: the dialect ("postgresql", "mysql" or
// "sqlite"), transactional.
func (s *Store) Info() idem.StoreInfo {
	name := s.d.name
	if name == "postgres" {
		name = "postgresql"
	}
	return idem.StoreInfo{Name: name, Transactional: true}
}

// NewStore returns a Store on db, which speaks dialect (idemsql.SQLite,
// idemsql.Postgres or idemmysql.Dialect). The tables must exist: run
// idemmigrate first.
func NewStore(db *sql.DB, dialect Dialect) (*Store, error) {
	if dialect.d == nil {
		return nil, errors.New("idemsql: NewStore needs a dialect: idemsql.SQLite, idemsql.Postgres or idemmysql.Dialect")
	}
	if db == nil {
		return nil, errors.New("idemsql: NewStore needs a *sql.DB")
	}
	s := &Store{db: db, d: dialect.d}
	if s.d.kind == kindSQLite {
		s.writes = newGate()
	}
	return s, nil
}

// DB returns the database the store works on.
func (s *Store) DB() *sql.DB { return s.db }

// Dialect returns the store's dialect.
func (s *Store) Dialect() Dialect { return Dialect{s.d} }

// Claim implements idem.Store in one statement (INSERT … ON CONFLICT …
// DO UPDATE … WHERE, or ON DUPLICATE KEY UPDATE on MySQL), followed, when
// it lost, by one read of the record that holds the key.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if s.d.maxTenant > 0 && len(p.Tenant) > s.d.maxTenant {
		return idem.ClaimResult{}, idem.NotApplied(fmt.Errorf("idemsql: claim: the tenant is %d bytes long, the %s table holds %d", len(p.Tenant), s.d.name, s.d.maxTenant))
	}
	args := s.d.claim.args(map[string]any{
		"tenant":      p.Tenant,
		"key":         p.Key,
		"fingerprint": nullBytes(p.Fingerprint),
		"token":       p.Token,
		"lease":       p.Lease.Microseconds(),
		"retention":   p.Retention.Microseconds(),
	})
	for range claimAttempts {
		var won bool
		err := s.retry(ctx, func() (err error) {
			won, err = s.claimOnce(ctx, args)
			return err
		})
		if err != nil {
			err = fmt.Errorf("idemsql: claim: %w", err)
			if ctx.Err() == nil {
				// Otherwise the database may run the statement after all
				// (it was cancelled after it was sent): the engine then
				// releases what it may claim, fenced by the token.
				err = idem.NotApplied(err)
			}
			return idem.ClaimResult{}, err
		}
		if won {
			return idem.ClaimResult{Won: true}, nil
		}
		rec, err := s.Get(ctx, p.Tenant, p.Key)
		if errors.Is(err, idem.ErrNotFound) {
			continue
		}
		if err != nil {
			return idem.ClaimResult{}, err
		}
		return idem.ClaimResult{Record: rec}, nil
	}
	return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: the record vanished %d times between claim and read", claimAttempts)
}

func (s *Store) claimOnce(ctx context.Context, args []any) (bool, error) {
	// The write lock and the connection first, so that failing to get
	// them is told apart from a statement cancelled once sent.
	if err := s.lockWrites(ctx); err != nil {
		return false, idem.NotApplied(err)
	}
	defer s.unlockWrites()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return false, idem.NotApplied(err)
	}
	defer conn.Close()
	if s.d.claimReturns {
		var token int64
		err := conn.QueryRowContext(ctx, s.d.claim.text, args...).Scan(&token)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	res, err := conn.ExecContext(ctx, s.d.claim.text, args...)
	if err != nil {
		return false, err
	}
	// See mysqlDialect.claim: 1 when won, 0 when lost.
	id, err := res.LastInsertId()
	return id == 1, err
}

// Begin implements idem.Store. It takes no connection: the transaction
// begins at the handler's first statement through TxFromContext(ctx) (or
// DB(ctx, db)), and a handler that makes none completes with a single
// statement. On SQLite the transaction begins IMMEDIATE, taking the write
// lock at its first statement, a read included.
func (s *Store) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	return newUnit(s), nil
}

// Extend implements idem.Store.
//
// On SQLite, while the execution's own transaction holds the write lock,
// Extend writes nothing and returns nil: no other writer, and so no
// takeover, can run before that transaction ends, and the unit of work
// extends the lease in the very transaction that releases the lock if it
// ends without completing (see unit.finish). Writing would only wait for
// the lock the execution itself holds.
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	var res sql.Result
	skipped := false
	err := s.retry(ctx, func() (err error) {
		if s.writes != nil {
			if skipped, err = s.writes.acquireExtend(ctx, s.writeLimit(ctx), p); err != nil || skipped {
				return err
			}
			defer s.unlockWrites()
		}
		res, err = s.extendOn(ctx, s.db, p)
		return err
	})
	if skipped {
		return nil
	}
	if err != nil {
		return fmt.Errorf("idemsql: extend: %w", err)
	}
	err = fenced(res)
	if errors.Is(err, idem.ErrLeaseLost) && s.d.changedRows {
		return s.stillHeld(ctx, p.Tenant, p.Key, p.Token)
	}
	return err
}

// fenced turns the rows affected by a statement fenced by (tenant, key,
// token, in flight) into nil or idem.ErrLeaseLost.
func fenced(res sql.Result) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("idemsql: rows affected: %w", err)
	}
	if n == 0 {
		return idem.ErrLeaseLost
	}
	return nil
}

// stillHeld settles an Extend that changed no row where rows affected
// count changed rows (MySQL): it may have matched a lease already ending
// at that instant (two extensions within one microsecond). It runs outside
// any transaction, so it reads the latest committed row.
func (s *Store) stillHeld(ctx context.Context, tenant, key string, token int64) error {
	var one int
	err := s.db.QueryRowContext(ctx, s.d.held.text, s.d.held.args(map[string]any{
		"tenant": tenant, "key": key, "token": token,
	})...).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.ErrLeaseLost
	}
	if err != nil {
		return fmt.Errorf("idemsql: extend: %w", err)
	}
	return nil
}

// extendOn runs the extension on db, a pool or a connection.
func (s *Store) extendOn(ctx context.Context, db execer, p idem.ExtendParams) (sql.Result, error) {
	return db.ExecContext(ctx, s.d.extend.text, s.d.extend.args(map[string]any{
		"tenant": p.Tenant, "key": p.Key, "token": p.Token, "lease": p.Lease.Microseconds(),
	})...)
}

// execer is what runs a statement: a *sql.DB, *sql.Conn or *sql.Tx.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Release implements idem.Store.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	args := s.d.release.args(map[string]any{"tenant": p.Tenant, "key": p.Key, "token": p.Token})
	err := s.retry(ctx, func() error {
		if err := s.lockWrites(ctx); err != nil {
			return err
		}
		defer s.unlockWrites()
		_, err := s.db.ExecContext(ctx, s.d.release.text, args...)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsql: release: %w", err)
	}
	s.changed(p.Tenant, p.Key)
	return nil
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	row := s.db.QueryRowContext(ctx, s.d.get.text, s.d.get.args(map[string]any{"tenant": tenant, "key": key})...)
	rec, err := scanRecord(s.d, row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, idem.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("idemsql: get: %w", err)
	}
	return rec, nil
}

// Purge implements idem.Store: one DELETE of at most Limit rows found
// through the expires_at index, sparing in-flight records whose lease is
// live.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultPurgeLimit
	}
	var n int
	err := s.retry(ctx, func() (err error) {
		if err := s.lockWrites(ctx); err != nil {
			return fmt.Errorf("idemsql: purge: %w", err)
		}
		defer s.unlockWrites()
		n, err = s.purgeOnce(ctx, int64(limit))
		return err
	})
	return n, err
}

func (s *Store) purgeOnce(ctx context.Context, limit int64) (int, error) {
	if !s.d.purgeInTx {
		res, err := s.db.ExecContext(ctx, s.d.purge.text, s.d.purge.args(map[string]any{"limit": limit})...)
		return purged(res, err)
	}
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: s.d.purgeIsolation})
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // harmless after Commit
	var n int
	if s.d.purgePick.text != "" {
		n, err = s.purgePicked(ctx, tx, limit)
	} else {
		n, err = purged(tx.ExecContext(ctx, s.d.purge.text, s.d.purge.args(map[string]any{"limit": limit})...))
	}
	if err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	return n, nil
}

// purgePicked runs purgePick in tx, then purge for each picked row, and
// returns how many it deleted.
func (s *Store) purgePicked(ctx context.Context, tx *sql.Tx, limit int64) (int, error) {
	rows, err := tx.QueryContext(ctx, s.d.purgePick.text, s.d.purgePick.args(map[string]any{"limit": limit})...)
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	type pk struct{ tenant, key []byte }
	var picked []pk
	for rows.Next() {
		var p pk
		if err := rows.Scan(&p.tenant, &p.key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("idemsql: purge: %w", err)
		}
		picked = append(picked, p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	if len(picked) == 0 {
		return 0, nil
	}
	del, err := tx.PrepareContext(ctx, s.d.purge.text)
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	defer del.Close()
	total := 0
	for _, p := range picked {
		n, err := purged(del.ExecContext(ctx, s.d.purge.args(map[string]any{"tenant": p.tenant, "key": p.key})...))
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}

func purged(res sql.Result, err error) (int, error) {
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("idemsql: purge: %w", err)
	}
	return int(n), nil
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

// lockWrites waits for this Store's turn to write, on SQLite; elsewhere
// it does nothing.
func (s *Store) lockWrites(ctx context.Context) error {
	if s.writes == nil {
		return nil
	}
	return s.writes.acquire(ctx, s.writeLimit(ctx))
}

// unlockWrites ends the turn lockWrites gave.
func (s *Store) unlockWrites() {
	if s.writes != nil {
		s.writes.release()
	}
}

// defaultBusyLimit bounds a writer's wait for the write lock when the
// database's busy timeout cannot be read.
const defaultBusyLimit = 10 * time.Second

// writeLimit is how long a writer waits for its turn while the lock does
// not change hands: as long as SQLite would let it wait for the lock
// itself (the connections' busy timeout). A queue that moves is waited
// out, as database/sql's pool queue would be; a writer that can never get
// the lock (a handler that claims another key of the same Store inside
// its own transaction) fails as it would without the queue, rather than
// waiting for ever.
func (s *Store) writeLimit(ctx context.Context) time.Duration {
	if ms := s.busyLimit.Load(); ms != 0 {
		return time.Duration(ms) * time.Millisecond
	}
	var ms int64
	if err := s.db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
		return defaultBusyLimit
	}
	if ms <= 0 {
		// No busy timeout: SQLite fails at once on a held lock; the
		// queue still waits, for the default.
		ms = defaultBusyLimit.Milliseconds()
	}
	s.busyLimit.Store(ms)
	return time.Duration(ms) * time.Millisecond
}

// nullBytes stores an empty fingerprint or body as NULL, which reads back
// as nil: idem treats nil and empty alike.
func nullBytes(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}
