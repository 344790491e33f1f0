package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

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
	name := s.d.name
	if name == "postgres" {
		name = "postgresql"
	}
	return idem.StoreInfo{Name: name, Transactional: true, SingleTransaction: s.single != nil}
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
	if s.d.kind == kindSQLite {
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

// Claim implements idem.Store.
//
// It first reads the record (peek): a replay, whose record is complete
// and within its retention, costs that one read, which takes no lock and
// waits for none; a claim would only lose to the record and read it
// again. Nothing but the passing of its retention changes a complete
// record, and the read decides that on the database clock, so the answer
// is the one a claim would give at that instant.
//
// Otherwise the claim is one statement (INSERT … ON CONFLICT … DO UPDATE
// … WHERE, or ON DUPLICATE KEY UPDATE on MySQL), followed, when it lost,
// by one read of the record that holds the key. On SQLite a key without a
// record is claimed by one INSERT, and one with a record in one
// transaction that holds the write lock (claimExisting).
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if s.d.maxTenant > 0 && len(p.Tenant) > s.d.maxTenant {
		return idem.ClaimResult{}, idem.NotApplied(fmt.Errorf("idemsql: claim: the tenant is %d bytes long, the %s table holds %d", len(p.Tenant), s.d.name, s.d.maxTenant))
	}
	if s.d.kind == kindPostgres && !pgText(p.Tenant) {
		// Refused here, in words that never quote it: PostgreSQL's own
		// error would, in part, and a tracer exports error texts.
		return idem.ClaimResult{}, idem.NotApplied(fmt.Errorf("idemsql: claim: the tenant is not valid UTF-8 text without NUL bytes, which PostgreSQL's text cannot hold (%d bytes; its value is not shown)", len(p.Tenant)))
	}
	rec, replay, err := s.peek(ctx, p.Tenant, p.Key)
	if err != nil {
		// A read: nothing was claimed.
		return idem.ClaimResult{}, idem.NotApplied(fmt.Errorf("idemsql: claim: %w", err))
	}
	if replay {
		return idem.ClaimResult{Record: rec}, nil
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
		var out claimOutcome
		err := s.retry(ctx, func() (err error) {
			out, err = s.claimOnce(ctx, p, args, rec != nil)
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
		if out.won {
			return s.won(ctx, p, out)
		}
		if out.record != nil {
			return idem.ClaimResult{Record: out.record}, nil
		}
		holder, _, err := s.read(ctx, s.d.get, p.Tenant, p.Key)
		if errors.Is(err, idem.ErrNotFound) {
			continue
		}
		if err != nil {
			return idem.ClaimResult{}, fmt.Errorf("idemsql: get: %w", err)
		}
		return idem.ClaimResult{Record: holder}, nil
	}
	return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: the record vanished %d times between claim and read", claimAttempts)
}

// claimOutcome is what one run of a claim found.
type claimOutcome struct {
	won      bool
	takeover bool
	// steps are the takeover's recovery points, encoded; stepsKnown is
	// false when they are still to be read (MySQL, see stepsOf).
	steps      []byte
	stepsKnown bool
	// record is the record that beat a lost claim, when the claim read
	// it (SQLite); otherwise Claim reads it.
	record *idem.Record
}

// peek reads the record of (tenant, key) before a claim, and whether it
// is complete and within its retention. It returns a nil record when
// there is none.
func (s *Store) peek(ctx context.Context, tenant, key string) (*idem.Record, bool, error) {
	var replay bool
	rec, _, err := s.read(ctx, s.d.peek, tenant, key, &replay)
	if errors.Is(err, idem.ErrNotFound) {
		return nil, false, nil
	}
	return rec, replay, err
}

// read runs q, a select of recordColumns (and extra) by tenant and key,
// on the pool. It returns the steps as stored, undecoded.
func (s *Store) read(ctx context.Context, q query, tenant, key string, extra ...any) (*idem.Record, []byte, error) {
	row := s.prepared(ctx, q).QueryRowContext(ctx, q.args(map[string]any{"tenant": tenant, "key": key})...)
	rec, steps, err := scanRecord(s.d, row, extra...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, idem.ErrNotFound
	}
	if err != nil {
		return nil, nil, err
	}
	return rec, steps, nil
}

// won turns a won claim into its result, reading a MySQL takeover's
// steps. The key is held from here on: an error is not ErrNotApplied, so
// that the engine releases it (and Release keeps the steps).
func (s *Store) won(ctx context.Context, p idem.ClaimParams, out claimOutcome) (idem.ClaimResult, error) {
	if out.takeover && !out.stepsKnown {
		err := s.prepared(ctx, s.d.stepsOf).QueryRowContext(ctx, s.d.stepsOf.args(map[string]any{
			"tenant": p.Tenant, "key": p.Key, "token": p.Token,
		})...).Scan(&out.steps)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: read the steps: %w", err)
		}
	}
	steps, err := decodeSteps(out.steps)
	if err != nil {
		// Never run the recorded steps again for want of reading them.
		return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: the recorded steps: %w", err)
	}
	return idem.ClaimResult{Won: true, Takeover: out.takeover, Steps: steps}, nil
}

// claimOnce runs the claim once. exists says that peek found a record.
func (s *Store) claimOnce(ctx context.Context, p idem.ClaimParams, args []any, exists bool) (claimOutcome, error) {
	if s.d.kind == kindSQLite {
		return s.claimSQLite(ctx, p, args, exists)
	}
	// A statement prepared once on the pool: MySQL's driver otherwise
	// prepares, executes and closes the statement at every claim, two
	// round trips and a packet instead of one round trip.
	claim := s.prepared(ctx, s.d.claim)
	if s.d.claimReturns {
		var out claimOutcome
		var token int64
		err := claim.QueryRowContext(ctx, args...).Scan(&token, &out.steps, &out.takeover)
		if errors.Is(err, sql.ErrNoRows) {
			return claimOutcome{}, nil
		}
		out.won, out.stepsKnown = err == nil, true
		return out, err
	}
	res, err := claim.ExecContext(ctx, args...)
	if err != nil {
		return claimOutcome{}, err
	}
	// See mysqlDialect.claim: 0 lost, 1 won, 2 won by a takeover.
	id, err := res.LastInsertId()
	return claimOutcome{won: id == 1 || id == 2, takeover: id == 2, stepsKnown: id != 2}, err
}

// claimSQLite claims on SQLite: one INSERT for a key without a record,
// claimExisting for one with a record.
func (s *Store) claimSQLite(ctx context.Context, p idem.ClaimParams, args []any, exists bool) (claimOutcome, error) {
	// The write lock and the connection first, so that failing to get
	// them is told apart from a statement cancelled once sent.
	if err := s.lockWrites(ctx); err != nil {
		return claimOutcome{}, idem.NotApplied(err)
	}
	defer s.unlockWrites()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return claimOutcome{}, idem.NotApplied(err)
	}
	defer conn.Close()
	if !exists {
		restore, err := s.asyncClaim(ctx, conn)
		if err != nil {
			return claimOutcome{}, idem.NotApplied(err)
		}
		var token int64
		err = conn.QueryRowContext(ctx, s.d.claim.text, args...).Scan(&token)
		restore()
		if err == nil {
			return claimOutcome{won: true, stepsKnown: true}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return claimOutcome{}, err
		}
		// A record was made since peek.
	}
	return s.claimExisting(ctx, conn, p)
}

// asyncClaim sets conn up, on SQLite in WAL mode, so that the claim of a
// new key commits without waiting for the disk (synchronous = NORMAL for
// that one statement), and returns what sets it back. A handler's write
// pays one flush to the disk with its commit, the bare handler's; without
// this, the claim would pay a second one, while holding SQLite's only
// write lock, which every other writer waits for.
//
// What that keeps. In WAL mode a commit appends to the WAL file; a
// synchronous one then flushes the file, and with it every commit before
// its own. The execution's later writes that must last are synchronous:
// its completion, a release, a step saved on the record. So a crash of the process
// loses nothing (the WAL is written), and a crash of the machine can lose
// only claims whose executions had made nothing durable since: after it,
// their keys are absent (a claim of a new key replaced nothing), and a
// retry runs the operation once, as it would after a crash before the
// claim. idempg's claims make the same bargain with PostgreSQL's
// synchronous_commit.
//
// The setting goes back before conn returns to the pool, or conn is
// closed: no other transaction ever commits under it.
func (s *Store) asyncClaim(ctx context.Context, conn *sql.Conn) (restore func(), err error) {
	setting := s.claimSync.Load()
	if setting == 0 {
		var mode string
		var sync int32
		if err := conn.QueryRowContext(ctx, `SELECT journal_mode, synchronous FROM pragma_journal_mode, pragma_synchronous`).Scan(&mode, &sync); err != nil {
			return nil, err
		}
		setting = -1
		if strings.EqualFold(mode, "wal") && sync >= 2 {
			setting = sync
		}
		s.claimSync.Store(setting)
	}
	if setting < 0 {
		return func() {}, nil
	}
	if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = NORMAL`); err != nil {
		discard(conn)
		return nil, err
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, err := conn.ExecContext(ctx, `PRAGMA synchronous = `+strconv.Itoa(int(setting))); err != nil {
			discard(conn)
		}
	}, nil
}

// claimExisting claims, on SQLite, a key that has a record, in one
// transaction that holds the write lock from its start, so that the
// record it reads is the one it replaces: atomic, as one statement would
// be. It replaces a record past its retention, and takes over one in
// flight whose lease ended with the same fingerprint, keeping its steps.
// A lost claim returns the record it read.
func (s *Store) claimExisting(ctx context.Context, conn *sql.Conn, p idem.ClaimParams) (claimOutcome, error) {
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return claimOutcome{}, err
	}
	open := true
	defer func() {
		if open {
			rollback(ctx, conn)
		}
	}()
	values := map[string]any{
		"tenant":      p.Tenant,
		"key":         p.Key,
		"fingerprint": nullBytes(p.Fingerprint),
		"token":       p.Token,
		"lease":       p.Lease.Microseconds(),
		"retention":   p.Retention.Microseconds(),
	}
	var expired, ended bool
	row := conn.QueryRowContext(ctx, s.d.claimRead.text, s.d.claimRead.args(values)...)
	rec, stored, err := scanRecord(s.d, row, &expired, &ended)
	var out claimOutcome
	switch {
	case errors.Is(err, sql.ErrNoRows):
		// Released or purged since peek (or since the INSERT met it).
		var token int64
		if err := conn.QueryRowContext(ctx, s.d.claim.text, s.d.claim.args(values)...).Scan(&token); err != nil {
			return claimOutcome{}, err
		}
		out = claimOutcome{won: true, stepsKnown: true}
	case err != nil:
		return claimOutcome{}, err
	case expired || ended:
		out = claimOutcome{won: true, takeover: !expired, stepsKnown: true}
		if out.takeover {
			out.steps = stored
		}
		values["steps"] = nullBytes(out.steps)
		values["old"] = rec.LeaseToken
		res, err := conn.ExecContext(ctx, s.d.claimReplace.text, s.d.claimReplace.args(values)...)
		if err != nil {
			return claimOutcome{}, err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return claimOutcome{}, fmt.Errorf("idemsql: claim: replaced %d records under the write lock, want 1 (%v)", n, err)
		}
	default:
		open = false
		rollback(ctx, conn)
		return claimOutcome{record: rec}, nil
	}
	// A COMMIT answered busy leaves the transaction open: it may run again.
	if err := s.retry(ctx, func() error {
		_, err := conn.ExecContext(ctx, "COMMIT")
		return err
	}); err != nil {
		return claimOutcome{}, err
	}
	open = false
	return out, nil
}

// rollback ends conn's transaction; a connection whose transaction state
// is unknown never goes back to the pool.
func rollback(ctx context.Context, conn *sql.Conn) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		discard(conn)
	}
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

// Release implements idem.Store. It is fenced on the token and the
// in-flight state, so a release that comes late (after a takeover, or
// after a completion whose commit the caller could not confirm) changes
// nothing. A record without recovery points is deleted, so that the retry
// runs afresh; one that holds some is kept in flight with its lease ended
// at once, so that the retry takes it over and gets them.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	values := map[string]any{"tenant": p.Tenant, "key": p.Key, "token": p.Token}
	err := s.retry(ctx, func() error {
		if err := s.lockWrites(ctx); err != nil {
			return err
		}
		defer s.unlockWrites()
		return s.releaseOnce(ctx, p, values)
	})
	if err != nil {
		return fmt.Errorf("idemsql: release: %w", err)
	}
	s.changed(p.Tenant, p.Key)
	return nil
}

func (s *Store) releaseOnce(ctx context.Context, p idem.ReleaseParams, values map[string]any) error {
	if s.d.releaseKeep.text == "" {
		_, err := s.db.ExecContext(ctx, s.d.release.text, s.d.release.args(values)...)
		return err
	}
	res, err := s.db.ExecContext(ctx, s.d.release.text, s.d.release.args(values)...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n > 0 {
		return err
	}
	// Nothing deleted: the record holds steps (or is no longer ours, and
	// this matches nothing either).
	_, err = s.db.ExecContext(ctx, s.d.releaseKeep.text, s.d.releaseKeep.args(values)...)
	return err
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
	QueryRowContext(ctx context.Context, args ...any) *sql.Row
}

type unprepared struct {
	db   *sql.DB
	text string
}

func (u unprepared) ExecContext(ctx context.Context, args ...any) (sql.Result, error) {
	return u.db.ExecContext(ctx, u.text, args...)
}

func (u unprepared) QueryRowContext(ctx context.Context, args ...any) *sql.Row {
	return u.db.QueryRowContext(ctx, u.text, args...)
}

// nullBytes stores an empty fingerprint or body as NULL, which reads back
// as nil: idem treats nil and empty alike.
func nullBytes(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return b
}

// pgText reports whether PostgreSQL's text can hold s: valid UTF-8
// without NUL bytes.
func pgText(s string) bool { return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 }
