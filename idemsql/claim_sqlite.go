package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// claimSQLite claims on SQLite: one INSERT for a key without a record,
// claimExisting for one with a record.
func (s *Store) claimSQLite(ctx context.Context, p idem.ClaimParams, args []any, exists bool) (claimOutcome, error) {
	// The write lock and the connection first, so that failing to get
	// them is told apart from a statement cancelled once sent.
	if err := s.lockWrites(ctx); err != nil {
		return claimOutcome{}, idem.NotApplied(err)
	}
	defer s.unlockWrites()
	if !exists && s.claimSync.Load() < 0 {
		// Nothing to set on a connection (synchronous is NORMAL or
		// below already, or the journal is not WAL): the INSERT runs as
		// a statement prepared once, on the pool, rather than parsed
		// again on a connection taken for it, most of a claim's CPU in
		// the pure-Go SQLite. A connection the pool cannot give is then
		// not told apart from a statement that may have run: the engine
		// releases the key, fenced by its token, which removes nothing
		// that was not claimed.
		var token int64
		err := s.prepared(ctx, s.d.claim).QueryRowContext(ctx, args...).Scan(&token)
		if err == nil {
			return claimOutcome{won: true, stepsKnown: true}, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return claimOutcome{}, err
		}
		exists = true
	}
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

// claimInSQLite claims on SQLite in the open transaction, which holds the
// write lock: it reads the record, inserts one when there is none, and
// replaces one past its retention, or in flight with an ended lease, the
// same fingerprint and no recovery points (an execution of a Store in the
// default mode that died). A lost claim returns the record it read.
func (s *Store) claimInSQLite(ctx context.Context, conn *sql.Conn, values map[string]any) (won, takeover bool, rec *idem.Record, err error) {
	// The claim of a key without a record first: one statement, which
	// inserts, or does nothing and returns no row when a record exists.
	// ClaimUnit comes here once its read found no complete record, mostly
	// for a key without any.
	var token int64
	err = conn.QueryRowContext(ctx, s.d.claim.text, s.d.claim.args(values)...).Scan(&token)
	if err == nil {
		return true, false, nil, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return false, false, nil, err
	}
	var expired, ended bool
	row := conn.QueryRowContext(ctx, s.d.claimRead.text, s.d.claimRead.args(values)...)
	rec, stored, err := scanRecord(s.d, row, &expired, &ended)
	if err != nil {
		// No row: the INSERT met one, under the write lock this
		// transaction holds, so it cannot have gone since.
		return false, false, nil, err
	}
	if ended && !expired {
		// Recovery points of a dead execution are not resumed in this
		// mode: such a record is left to a Store in the default mode.
		ended = len(stored) == 0
	}
	if !expired && !ended {
		return false, false, rec, nil
	}
	values["steps"] = nil
	values["old"] = rec.LeaseToken
	res, err := conn.ExecContext(ctx, s.d.claimReplace.text, s.d.claimReplace.args(values)...)
	if err != nil {
		return false, false, nil, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return false, false, nil, fmt.Errorf("idemsql: claim: replaced %d records under the write lock, want 1 (%v)", n, err)
	}
	return true, !expired, nil, nil
}

// claimNewSQLite is rules.claimUnitNew on SQLite: the single-transaction
// mode's BEGIN IMMEDIATE, savepoint and claim of a key without a record
// (the INSERT that does nothing when a record exists) in one call. It
// returns nil, without error, when a record exists: the claim then goes
// the general way (a duplicate that waited for the lock mostly, which
// finds the holder's record complete).
func (s *Store) claimNewSQLite(ctx context.Context, p idem.ClaimParams, wait time.Duration) (*singleUnit, error) {
	u := newUnit(s)
	u.lockWait = s.singleLockWait(wait)
	beginCtx, cancel, unhold := s.duplicateWait(ctx, p, wait)
	defer cancel()
	u.mu.Lock()
	res, err := u.beginThen(beginCtx, &s.d.claim, claimValues(p))
	u.mu.Unlock()
	if err != nil {
		unhold()
		if beginCtx != ctx && ctx.Err() == nil && beginCtx.Err() != nil {
			return nil, fmt.Errorf("idemsql: %w (waited %s for its transaction)", idem.ErrInFlight, wait)
		}
		return nil, err
	}
	// The INSERT is the text's last statement: its changes are reported.
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		_ = u.Rollback(ctx)
		unhold()
		return nil, err
	}
	return &singleUnit{u: u, params: p, unhold: unhold}, nil
}
