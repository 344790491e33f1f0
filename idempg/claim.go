package idempg

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
)

// claimSQL claims (tenant, key) in one statement, and when the claim is
// lost returns the record that holds the key in the same round trip.
//
//   - cur reads the current row, and flags whether a claim may take it:
//     past retention, or in flight with an expired lease and the same
//     fingerprint.
//   - ins writes only when cur found no row or a claimable one. A key that
//     is held (the replay of a completed request, or a duplicate of one in
//     flight) is therefore answered by a plain read: no row lock, no
//     transaction id, no WAL. When ins does write, ON CONFLICT decides
//     against the latest committed version of the row, not cur's
//     snapshot, so two claims can never both win.
//   - the async subquery turns synchronous_commit off for this statement's
//     own implicit transaction only (is_local = true; it is evaluated only
//     when ins writes, and a claim that writes nothing has nothing to
//     flush). The claim's commit then returns before its WAL is on disk.
//     Guaranteed: the completion of the execution, a synchronous commit
//     made after this statement returned, flushes the WAL past the
//     claim's commit record, so no stored answer, and no business write
//     committed with it, ever outlives its claim in a crash. Lost in a
//     crash of PostgreSQL or of its machine: claims committed since the
//     last WAL flush (at most 3 × wal_writer_delay old), whose executions
//     had neither completed nor been released (both commit synchronously)
//     and committed no business write; their keys come back absent, or
//     as the expired record a takeover replaced, and the retry runs the
//     operation. That holds while the completions commit synchronously
//     (synchronous_commit on, the default); see "Asynchronous claims" in
//     the package documentation and docs/STORES.md.
//   - a takeover keeps the recovery points of the record it replaces
//     (claimConflict), and ins returns them from the row version it
//     updated: the latest committed one, under its row lock, so that a
//     step the previous holder saved after this statement's snapshot is
//     not missed. A fresh key returns NULL there, and a claim that is
//     lost (a replay) reads no steps at all: they cost nothing outside a
//     takeover.
//
// The final SELECT always yields one row: won; whether the won claim took
// over an in-flight record (cur saw one that was not past retention); the
// steps of a won claim; and the held record's columns or NULLs. When won is
// false and the columns are NULL, the row that beat this claim was
// committed after the statement's snapshot was taken; Claim then runs the
// statement again, with a fresh snapshot.
const claimSQL = `WITH cur AS (
	SELECT ` + recordColumns + `,
		(expires_at <= now()
		 OR (state = 'in_flight' AND locked_until <= now() AND fingerprint IS NOT DISTINCT FROM $3::bytea)) AS claimable
	FROM idem_keys
	WHERE tenant_id = $1 AND idem_key = $2
), ins AS (
	INSERT INTO idem_keys AS k (tenant_id, idem_key, fingerprint, state, lease_token,
		locked_until, created_at, expires_at)
	SELECT $1, $2, $3::bytea, 'in_flight', $4::bigint,
		now() + $5::bigint * interval '1 microsecond', now(), now() + $6::bigint * interval '1 microsecond'
	FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async
	WHERE NOT EXISTS (SELECT FROM cur WHERE NOT cur.claimable)
` + claimConflict + `
	RETURNING k.steps
)
SELECT w.won, w.won AND EXISTS (SELECT FROM cur WHERE cur.expires_at > now()), w.steps, ` + curColumns + `
FROM (SELECT EXISTS (SELECT FROM ins) AS won, (SELECT steps FROM ins) AS steps) AS w
	LEFT JOIN cur c ON NOT c.claimable`

// claimConflict is the ON CONFLICT clause of a claim's INSERT, shared by
// claimSQL and claimBatchSQL: it takes the row over only when it is past
// retention, or in flight with an expired lease and the same fingerprint,
// the conditions under which the cur CTE calls a row claimable. A row past
// retention counts as absent, and loses its recovery points with the rest;
// an in-flight one taken over keeps them for the new holder.
const claimConflict = `	ON CONFLICT (tenant_id, idem_key) DO UPDATE SET
		fingerprint = excluded.fingerprint,
		state = 'in_flight',
		lease_token = excluded.lease_token,
		locked_until = excluded.locked_until,
		storage_mode = 0,
		status_code = NULL,
		response_headers = NULL,
		response_body = NULL,
		resource_ref = NULL,
		created_at = excluded.created_at,
		completed_at = NULL,
		expires_at = excluded.expires_at,
		steps = CASE WHEN k.expires_at <= now() THEN NULL ELSE k.steps END
	WHERE k.expires_at <= now()
		OR (k.state = 'in_flight' AND k.locked_until <= now() AND k.fingerprint IS NOT DISTINCT FROM excluded.fingerprint)`

// curColumns are recordColumns read from the cur CTE.
const curColumns = `c.fingerprint, c.state, c.lease_token, c.locked_until, c.storage_mode, c.status_code,
	c.response_headers, c.response_body, c.resource_ref, c.created_at, c.completed_at, c.expires_at`

// claimAttempts bounds how many times Claim runs its statement. A second
// run is needed only when the row that beat the claim was committed after
// the first run's snapshot; each further run needs yet another concurrent
// commit (a release, a takeover) to land in that same instant, so
// exhausting the attempts means something is badly wrong.
const claimAttempts = 5

// errClaimRace is returned when every attempt of Claim met a concurrent
// change it could not see.
var errClaimRace = errors.New("idempg: claim kept losing to concurrent changes it could not read")

// Claim implements idem.Store in one round trip in the common cases: a
// fresh key, a replay, a duplicate in flight, a takeover. A claim that
// loses a race to a concurrent claim of the same key needs a second round
// trip to read the winner's record. Unless Config.ClaimBatchSize is 1,
// claims made at the same time share one statement (claimBatchSQL).
//
// A won claim that takes over an in-flight record reports Takeover and the
// steps recorded under it; the record of a lost claim comes without its
// steps (Record.Steps is nil), which only Get reads, so that a replay
// reads no more than it did before recovery points.
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if err := checkIdentity(p.Tenant, p.Key); err != nil {
		return idem.ClaimResult{}, idem.NotApplied(err)
	}
	fingerprint := p.Fingerprint
	if len(fingerprint) == 0 {
		// NULL, so that "no fingerprint" compares equal whether the
		// caller passed nil or an empty slice, as idem.Record's
		// SameFingerprint does.
		fingerprint = nil
	}
	if s.batcher != nil {
		return s.batcher.claim(ctx, p, fingerprint)
	}
	for range claimAttempts {
		var r claimRow
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return idem.ClaimResult{}, idem.NotApplied(err) // nothing sent
		}
		err = conn.QueryRow(ctx, s.claimQuery, p.Tenant, p.Key, fingerprint, p.Token,
			micros(p.Lease), micros(p.Retention)).Scan(r.dest()...)
		conn.Release()
		if err != nil {
			return idem.ClaimResult{}, claimError(err)
		}
		if r.answered() {
			return r.result(p)
		}
	}
	return idem.ClaimResult{}, errClaimRace
}

// claimRow is what a claim statement answered for one claim.
type claimRow struct {
	won      bool
	takeover bool
	steps    []byte // the recovery points a won takeover kept
	record   scannedRecord
}

// dest lists where a claim statement's columns go, after the batch's
// claim number when there is one.
func (r *claimRow) dest() []any {
	return append([]any{&r.won, &r.takeover, &r.steps}, r.record.dest()...)
}

// answered reports whether the statement decided the claim; false when it
// was beaten by a row its snapshot could not see.
func (r *claimRow) answered() bool { return r.won || r.record.present() }

// result turns an answered row into what Claim returns. Recorded steps
// that do not decode fail the claim, which the engine then releases: the
// corruption is reported rather than the steps silently run again.
func (r *claimRow) result(p idem.ClaimParams) (idem.ClaimResult, error) {
	if r.won {
		steps, err := decodeSteps(r.steps)
		if err != nil {
			return idem.ClaimResult{}, err
		}
		return idem.ClaimResult{Won: true, Takeover: r.takeover, Steps: steps}, nil
	}
	rec, err := r.record.record(p.Tenant, p.Key)
	if err != nil {
		return idem.ClaimResult{}, err
	}
	return idem.ClaimResult{Record: rec}, nil
}
