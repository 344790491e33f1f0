package idempg

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The single-transaction mode (Config.SingleTransaction): nothing is
// committed before the handler runs. The claim takes a PostgreSQL
// advisory lock named after the key, on the connection that then runs
// the handler's transaction; the completed record is inserted, once, by
// the statement before the COMMIT; the lock is released right after the
// COMMIT, in the same round trip. The lock is the lease: a duplicate
// waits on it (bounded by its wait limit), and when the holder's process
// dies its connection closes, the server rolls the transaction back and
// frees the lock, and the next claim runs afresh. See "Single-transaction
// mode" in the package documentation and docs/BENCHMARKS.md for why the
// lock and a single INSERT rather than an in-flight row updated at the
// end.
//
// The lock is a session lock (pg_advisory_lock), not a transaction one:
// it outlives the handler's own Rollback, so that the answer it then
// stores alone is still written under the lock, and so that the claim
// needs no transaction of its own (a replay is one autocommit read, with
// no transaction to end). Every path that gives the connection back to
// the pool releases it first, or closes the connection.

// singleClaimSQL reads the key's record and, when the key is free (no
// record, or one a claim may replace), tries its lock, in one autocommit
// statement. A record that holds the key is answered without a lock.
// claimable: no record, past retention, or in flight with an ended lease,
// no recovery points and the same fingerprint (an execution of a store in
// the default mode that died).
const singleClaimSQL = `SELECT ` + curColumns + `, c.claimable,
	CASE WHEN c.claimable THEN pg_try_advisory_lock($4) ELSE false END AS locked
FROM (SELECT k.*, (k.state IS NULL OR k.expires_at <= now()
		OR (k.state = 'in_flight' AND k.locked_until <= now() AND k.steps IS NULL
			AND k.fingerprint IS NOT DISTINCT FROM $3::bytea)) AS claimable
	FROM (SELECT) AS one LEFT JOIN idem_keys k ON k.tenant_id = $1 AND k.idem_key = $2) AS c`

// singleHeldSQL tells whether a record holds the key, read in a
// statement of its own after singleClaimSQL took the lock: that
// statement's snapshot was taken before its lock, so a holder that
// committed and unlocked between the two was not seen by it. Sent in the
// same round trip.
const singleHeldSQL = `SELECT EXISTS (SELECT FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2
	AND expires_at > now() AND (state = 'complete' OR locked_until > now() OR steps IS NOT NULL
		OR fingerprint IS DISTINCT FROM $3::bytea))`

// singleWaitSQL waits for the key's lock, at most $2 milliseconds
// (lock_timeout, set for this statement's implicit transaction only: the
// FROM clause is evaluated before the lock is asked for).
const singleWaitSQL = `SELECT pg_advisory_lock($1) FROM (SELECT set_config('lock_timeout', $2, true)) AS timeout`

// singleRecheckSQL reads the record again once the lock is held (a
// statement of its own, so that its snapshot sees what the holder
// committed) and releases the lock when the record holds the key.
const singleRecheckSQL = `SELECT ` + curColumns + `, c.claimable,
	CASE WHEN c.claimable THEN true ELSE NOT pg_advisory_unlock($4) END AS locked
FROM (SELECT k.*, (k.state IS NULL OR k.expires_at <= now()
		OR (k.state = 'in_flight' AND k.locked_until <= now() AND k.steps IS NULL
			AND k.fingerprint IS NOT DISTINCT FROM $3::bytea)) AS claimable
	FROM (SELECT) AS one LEFT JOIN idem_keys k ON k.tenant_id = $1 AND k.idem_key = $2) AS c`

// singleInsertSQL writes the completed record of a fresh key: a plain
// INSERT, the record's only write. A row that appeared meanwhile (a store
// in the default mode claimed the key) fails it with a unique violation,
// which aborts the transaction: nothing commits.
const singleInsertSQL = `INSERT INTO idem_keys (tenant_id, idem_key, fingerprint, state, lease_token,
	locked_until, storage_mode, status_code, response_headers, response_body, resource_ref,
	created_at, completed_at, expires_at)
VALUES ($1, $2, $3, 'complete', $4, now(), $5, $6, $7, $8, $9, now(), now(),
	now() + $10::bigint * interval '1 microsecond')`

// singleReplaceSQL writes the completed record over the one the claim
// found replaceable, still replaceable under its row lock; when it is not
// any more, the division by zero aborts the transaction.
const singleReplaceSQL = `WITH w AS (` + singleInsertSQL + `
ON CONFLICT (tenant_id, idem_key) DO UPDATE SET
	fingerprint = excluded.fingerprint, state = 'complete', lease_token = excluded.lease_token,
	locked_until = excluded.locked_until, storage_mode = excluded.storage_mode,
	status_code = excluded.status_code, response_headers = excluded.response_headers,
	response_body = excluded.response_body, resource_ref = excluded.resource_ref,
	created_at = excluded.created_at, completed_at = excluded.completed_at,
	expires_at = excluded.expires_at, steps = NULL
WHERE idem_keys.expires_at <= now()
	OR (idem_keys.state = 'in_flight' AND idem_keys.locked_until <= now() AND idem_keys.steps IS NULL
		AND idem_keys.fingerprint IS NOT DISTINCT FROM excluded.fingerprint)
RETURNING 1)
SELECT 1 / count(*)::int FROM w`

// singleUnlockSQL releases the key's lock.
const singleUnlockSQL = `SELECT pg_advisory_unlock($1)`

// singleInsertFormats are the parameter formats of singleInsertSQL: the
// fingerprint and the body go as raw bytes, the rest as text.
var singleInsertFormats = []int16{0, 0, 1, 0, 0, 0, 0, 1, 0, 0}

// int8OIDs types the one parameter of singleUnlockSQL when it is sent
// unprepared, so that the server needs no Describe round trip.
var int8OIDs = []uint32{pgtype.Int8OID}

// lockID names the advisory lock of (tenant, key): 64 bits of FNV-1a over
// both, separated by a NUL byte, which neither may hold. Two keys that
// share a lock only wait for each other; the record's primary key still
// tells them apart.
func lockID(tenant, key string) int64 {
	h := fnv.New64a()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return int64(h.Sum64())
}

// ClaimUnit implements idem.UnitClaimer, the claim of the
// single-transaction mode: one autocommit statement reads the record and,
// when the key is free, takes its lock. A replay is that one read; a won
// claim keeps the connection for the handler, whose first query carries
// the BEGIN. When another execution holds the lock, ClaimUnit waits for
// it at most wait (zero: not at all), then reads the record again: the
// holder's answer, or a claim of its own when the holder rolled back.
// Past wait it returns idem.ErrInFlight.
//
// It fails on a Store in the default mode, whose engine claims with Claim.
func (s *Store) ClaimUnit(ctx context.Context, p idem.ClaimParams, wait time.Duration) (idem.ClaimResult, idem.UnitOfWork, error) {
	if !s.single {
		return idem.ClaimResult{}, nil, idem.NotApplied(errors.New("idempg: ClaimUnit needs Config.SingleTransaction"))
	}
	if err := checkIdentity(p.Tenant, p.Key); err != nil {
		return idem.ClaimResult{}, nil, idem.NotApplied(err)
	}
	fingerprint := p.Fingerprint
	if len(fingerprint) == 0 {
		fingerprint = nil
	}
	id := lockID(p.Tenant, p.Key)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return idem.ClaimResult{}, nil, idem.NotApplied(err)
	}
	var r singleRow
	var held bool
	b := &pgx.Batch{}
	b.Queue(singleClaimSQL, p.Tenant, p.Key, fingerprint, id).QueryRow(func(row pgx.Row) error { return row.Scan(r.dest()...) })
	b.Queue(singleHeldSQL, p.Tenant, p.Key, fingerprint).QueryRow(func(row pgx.Row) error { return row.Scan(&held) })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		// Whether the lock was taken is unknown: close the session, which
		// frees it.
		dropConn(conn)
		return idem.ClaimResult{}, nil, interpretError(err)
	}
	if r.locked && held {
		// The holder committed between the claim's snapshot and its
		// lock: read the record under the lock, which gives it back.
		if err := s.recheck(ctx, conn, p, fingerprint, id, &r); err != nil {
			return idem.ClaimResult{}, nil, err
		}
	}
	if r.claimable && !r.locked {
		// Another execution holds the lock: wait for it, then read again.
		if wait <= 0 {
			conn.Release()
			return idem.ClaimResult{}, nil, fmt.Errorf("idempg: %w (its transaction holds the key)", idem.ErrInFlight)
		}
		if err := s.awaitLock(ctx, conn, p, fingerprint, id, wait, &r); err != nil {
			return idem.ClaimResult{}, nil, err
		}
	}
	if !r.claimable {
		conn.Release()
		rec, err := r.record.record(p.Tenant, p.Key)
		if err != nil {
			return idem.ClaimResult{}, nil, err
		}
		return idem.ClaimResult{Record: rec}, nil, nil
	}
	u := &singleUnit{lock: id, fingerprint: fingerprint, retention: p.Retention, replace: r.record.present()}
	u.store, u.conn, u.keepConn = s, conn, true
	u.handle.u = &u.unit
	// A record replaced while not yet past retention was an execution in
	// flight whose lease ended: a takeover.
	takeover := r.record.present() && r.record.expiresAt != nil && r.record.expiresAt.After(time.Now()) &&
		deref(r.record.state) == string(idem.StateInFlight)
	return idem.ClaimResult{Won: true, Takeover: takeover}, u, nil
}

// awaitLock waits for the lock of a key that another execution holds, and
// reads the record again, into r, in one round trip. It gives the
// connection back, or closes it, on every path but a won claim.
func (s *Store) awaitLock(ctx context.Context, conn *pgxpool.Conn, p idem.ClaimParams, fingerprint []byte, id int64, wait time.Duration, r *singleRow) error {
	ms := strconv.FormatInt(max(wait.Milliseconds(), 1), 10)
	b := &pgx.Batch{}
	b.Queue(singleWaitSQL, id, ms)
	b.Queue(singleRecheckSQL, p.Tenant, p.Key, fingerprint, id)
	br := conn.SendBatch(ctx, b)
	_, err := br.Exec()
	if err == nil {
		*r = singleRow{}
		err = br.QueryRow().Scan(r.dest()...)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		// lock_timeout: the holder outlived the wait, and the lock was
		// not granted.
		conn.Release()
		return fmt.Errorf("idempg: %w (waited %s for its transaction)", idem.ErrInFlight, wait)
	default:
		dropConn(conn)
		return interpretError(err)
	}
}

// recheck reads the record again, under the key's lock, into r, and
// releases the lock when the record holds the key.
func (s *Store) recheck(ctx context.Context, conn *pgxpool.Conn, p idem.ClaimParams, fingerprint []byte, id int64, r *singleRow) error {
	*r = singleRow{}
	if err := conn.QueryRow(ctx, singleRecheckSQL, p.Tenant, p.Key, fingerprint, id).Scan(r.dest()...); err != nil {
		dropConn(conn)
		return interpretError(err)
	}
	return nil
}

// singleRow is what singleClaimSQL and singleRecheckSQL answer.
type singleRow struct {
	record    scannedRecord
	claimable bool
	locked    bool
}

func (r *singleRow) dest() []any { return append(r.record.dest(), &r.claimable, &r.locked) }

// dropConn closes a pool connection whose session may hold a key's lock,
// and gives it back to the pool, which then destroys it: the server frees
// the session's locks with it.
func dropConn(conn *pgxpool.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Conn().Close(ctx)
	conn.Release()
}

// singleUnit is the unit of work of a claim in the single-transaction
// mode: the handler's transaction on the connection that holds the key's
// lock. Its handler side is unit's; it completes and rolls back its own
// way.
type singleUnit struct {
	unit
	lock        int64
	fingerprint []byte
	retention   time.Duration
	// replace: the claim found a record that it may replace (past
	// retention, or a dead execution of the default mode).
	replace bool
}

// Rollback implements idem.UnitOfWork: the transaction, if any, is rolled
// back, the key's lock released, in one round trip. Harmless after
// Complete.
func (u *singleUnit) Rollback(ctx context.Context) error {
	if u.state.Swap(unitEnded) == unitEnded {
		return nil
	}
	pgConn := u.conn.Conn().PgConn()
	if pgConn.IsClosed() {
		u.conn.Release()
		return nil
	}
	inTx := pgConn.TxStatus() != 'I'
	pl := pgConn.StartPipeline(ctx)
	if inTx {
		pl.SendQueryParams("ROLLBACK", nil, nil, nil, nil)
	}
	pl.SendQueryParams(singleUnlockSQL, [][]byte{strconv.AppendInt(nil, u.lock, 10)}, int8OIDs, nil, nil)
	return u.endPipeline(pl, nil)
}

// Complete implements idem.UnitOfWork. The completed record is inserted
// by the statement before the COMMIT, and the lock released after it, in
// one round trip: [INSERT, COMMIT, unlock]. When the handler never
// queried, or rolled its transaction back, the pipeline opens a
// transaction of its own for the record: [BEGIN, INSERT, COMMIT, unlock].
// When a failed statement aborted the handler's transaction, or the
// engine asks for the answer without the writes (WithoutWrites),
// [ROLLBACK, BEGIN, INSERT, COMMIT, unlock]: the writes are undone, the
// answer stored alone, and the key stays locked until it is. A success
// answer over an aborted transaction is not stored (idem.ErrWritesAborted).
//
// When the INSERT fails (another store claimed the key in the default
// mode meanwhile), nothing commits and Complete returns idem.ErrLeaseLost.
func (u *singleUnit) Complete(ctx context.Context, p idem.CompleteParams) error {
	values, err := u.insertValues(p)
	if err != nil {
		return err // the unit stays open; the caller's Rollback ends it
	}
	prev := u.state.Swap(unitEnded)
	if prev == unitEnded {
		return pgx.ErrTxClosed
	}
	pgConn := u.conn.Conn().PgConn()
	if pgConn.IsClosed() {
		u.conn.Release()
		return fmt.Errorf("idempg: complete: the connection of the handler's transaction was lost, its writes with it; nothing stored: %w", pgx.ErrTxClosed)
	}
	if u.lostTo() != nil {
		// A deadlock or a serialization failure rolled the handler's
		// transaction back: nothing of this execution is stored, not
		// even an answer alone (see ErrTxEnded), as in the default mode.
		u.unlockAndRelease(ctx)
		return u.gone()
	}
	status := pgConn.TxStatus()
	handlerBegan := prev == unitOpen && u.tx != nil
	switch {
	case handlerBegan && status == 'I':
		u.unlockAndRelease(ctx)
		return fmt.Errorf("idempg: complete: the handler's transaction was ended without idem (a COMMIT or ROLLBACK sent through Conn?); its writes may or may not be committed, and nothing is stored: %w", pgx.ErrTxClosed)
	case status == 'E' && p.Result.Status < 400:
		u.unlockAndRelease(ctx)
		return idem.ErrWritesAborted
	}
	name, query := "idem_single_insert", singleInsertSQL
	if u.replace {
		name, query = "idem_single_replace", singleReplaceSQL
	}
	// Prepared once per connection (pgx keeps it by name): parsing and
	// planning the INSERT on every request cost the backend more than its
	// execution.
	sd, unlock, err := u.prepare(ctx, name, query)
	var pgErr *pgconn.PgError
	if status == 'E' && errors.As(err, &pgErr) && pgErr.Code == "25P02" {
		// Not yet prepared on this connection, whose transaction a
		// failed statement aborted, which refuses a PREPARE: end that
		// transaction first (the pipeline below then opens its own).
		if _, err = pgConn.Exec(ctx, "ROLLBACK").ReadAll(); err == nil {
			status = pgConn.TxStatus()
			sd, unlock, err = u.prepare(ctx, name, query)
		}
	}
	if err != nil {
		u.unlockAndRelease(ctx)
		return interpretError(err)
	}
	pl := pgConn.StartPipeline(ctx)
	insertAt := 0
	if status != 'I' && (status == 'E' || p.WithoutWrites) {
		pl.SendQueryParams("ROLLBACK", nil, nil, nil, nil)
		insertAt++
		status = 'I'
	}
	if status == 'I' {
		pl.SendQueryParams("BEGIN", nil, nil, nil, nil)
		insertAt++
	}
	pl.SendQueryStatement(sd, values, singleInsertFormats, nil)
	pl.SendQueryParams("COMMIT", nil, nil, nil, nil)
	pl.SendQueryStatement(unlock, [][]byte{strconv.AppendInt(nil, u.lock, 10)}, nil, nil)
	return u.endPipeline(pl, func(errs []error, tags []pgconn.CommandTag) error {
		for _, err := range errs[:insertAt] {
			if err != nil {
				return interpretError(err) // ROLLBACK or BEGIN failed
			}
		}
		if err := errs[insertAt]; err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (pgErr.Code == "23505" || pgErr.Code == "22012") {
				return fmt.Errorf("idempg: the key was claimed by another execution meanwhile: %w", idem.ErrLeaseLost)
			}
			return interpretError(err)
		}
		if err := errs[insertAt+1]; err != nil {
			return interpretError(err) // a deferred constraint refused the commit
		}
		if tag := tags[insertAt+1]; tag.String() != "COMMIT" {
			return fmt.Errorf("idempg: commit ended with %q: %w", tag.String(), pgx.ErrTxCommitRollback)
		}
		return nil
	})
}

// prepare prepares the record's statement (name, query) and the unlock
// on u's connection; pgx sends nothing for one it prepared before.
func (u *singleUnit) prepare(ctx context.Context, name, query string) (sd, unlock *pgconn.StatementDescription, err error) {
	if sd, err = u.conn.Conn().Prepare(ctx, name, query); err != nil {
		return nil, nil, err
	}
	unlock, err = u.conn.Conn().Prepare(ctx, "idem_single_unlock", singleUnlockSQL)
	return sd, unlock, err
}

// insertValues encodes p for singleInsertSQL.
func (u *singleUnit) insertValues(p idem.CompleteParams) ([][]byte, error) {
	res := p.Result
	header, err := idemcodec.MarshalHeader(res.Header)
	if err != nil {
		return nil, fmt.Errorf("idempg: encode result header: %w", err)
	}
	var body, ref []byte
	if len(res.Body) > 0 {
		body = res.Body
	}
	if res.Reference != "" {
		ref = []byte(res.Reference)
	}
	return [][]byte{
		[]byte(p.Tenant),
		[]byte(p.Key),
		u.fingerprint,
		strconv.AppendInt(nil, p.Token, 10),
		strconv.AppendUint(nil, uint64(res.Mode), 10),
		strconv.AppendInt(nil, int64(res.Status), 10),
		header,
		body,
		ref,
		strconv.AppendInt(nil, micros(u.retention), 10),
	}, nil
}

// unlockAndRelease ends whatever transaction is open and releases the
// key's lock, for the paths that store nothing.
func (u *singleUnit) unlockAndRelease(ctx context.Context) {
	pgConn := u.conn.Conn().PgConn()
	pl := pgConn.StartPipeline(ctx)
	if pgConn.TxStatus() != 'I' {
		pl.SendQueryParams("ROLLBACK", nil, nil, nil, nil)
	}
	pl.SendQueryParams(singleUnlockSQL, [][]byte{strconv.AppendInt(nil, u.lock, 10)}, int8OIDs, nil, nil)
	_ = u.endPipeline(pl, nil)
}

// endPipeline syncs pl, whose last statement releases the key's lock,
// reads every result, and gives the connection back to the pool, or
// closes it when the lock's release was not confirmed. check, when not
// nil, judges the other statements' results.
func (u *singleUnit) endPipeline(pl *pgconn.Pipeline, check func(errs []error, tags []pgconn.CommandTag) error) error {
	conn := u.conn
	var errs []error
	var tags []pgconn.CommandTag
	var ioErr error
	if err := pl.Sync(); err != nil {
		ioErr = err
	}
	for ioErr == nil {
		res, err := pl.GetResults()
		if err != nil {
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				ioErr = err
				break
			}
			errs, tags = append(errs, err), append(tags, pgconn.CommandTag{})
			continue
		}
		if res == nil {
			ioErr = errors.New("idempg: pipeline ended early")
			break
		}
		if rr, ok := res.(*pgconn.ResultReader); ok {
			tag, err := rr.Close()
			errs, tags = append(errs, err), append(tags, tag)
			continue
		}
		if _, ok := res.(*pgconn.PipelineSync); ok {
			break
		}
	}
	if cerr := pl.Close(); ioErr == nil && cerr != nil {
		ioErr = cerr
	}
	// The unlock is the last statement: a server error before it skips
	// it (the pipeline aborts up to the Sync). Then, or when reading
	// failed, the lock may still be held.
	n := len(errs)
	unlocked := ioErr == nil && n > 0 && errs[n-1] == nil && tags[n-1].String() == "SELECT 1"
	if !unlocked || conn.Conn().PgConn().TxStatus() != 'I' {
		if ioErr == nil && n > 0 && errs[n-1] != nil {
			// Skipped after an error: end the aborted transaction, if
			// one is open, and release the lock, in one more round trip.
			if u.finishAfterError() {
				unlocked = true
			}
		}
	}
	if !unlocked {
		dropConn(conn)
	} else {
		conn.Release()
	}
	if ioErr != nil {
		return ioErr
	}
	if check != nil {
		for len(errs) < 5 {
			errs, tags = append(errs, nil), append(tags, pgconn.CommandTag{})
		}
		return check(errs, tags)
	}
	for _, err := range errs {
		if err != nil {
			return interpretError(err)
		}
	}
	return nil
}

// finishAfterError rolls back the transaction a failed statement left
// aborted, if any, and releases the key's lock; false when that failed.
func (u *singleUnit) finishAfterError() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pgConn := u.conn.Conn().PgConn()
	if pgConn.TxStatus() != 'I' {
		if _, err := pgConn.Exec(ctx, "ROLLBACK").ReadAll(); err != nil {
			return false
		}
	}
	var unlocked bool
	err := u.conn.QueryRow(ctx, singleUnlockSQL, u.lock).Scan(&unlocked)
	return err == nil && unlocked
}

var _ idem.UnitClaimer = (*Store)(nil)
