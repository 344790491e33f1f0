package idempg

import (
	"context"
	"errors"

	"github.com/idem-go/idem"
	"github.com/jackc/pgx/v5/pgconn"
)

// Extend implements idem.Store: the heartbeat. It moves the lease end to
// now+Lease and never lets the retention end before it, so a record whose
// handler outlives its retention is not treated as absent while it runs.
// The retention is only written when it must grow, which keeps most
// heartbeats HOT updates (expires_at is indexed).
func (s *Store) Extend(ctx context.Context, p idem.ExtendParams) error {
	tag, err := s.pool.Exec(ctx, `UPDATE idem_keys
		SET locked_until = now() + $4::bigint * interval '1 microsecond',
		    expires_at = greatest(expires_at, now() + $4::bigint * interval '1 microsecond')
		WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'in_flight'`,
		p.Tenant, p.Key, p.Token, micros(p.Lease))
	if err != nil {
		return interpretError(err)
	}
	if tag.RowsAffected() == 0 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Release implements idem.Store. It is fenced on the token and the
// in-flight state, so a release that comes late (after a takeover, or
// after a completion whose commit the caller could not confirm) changes
// nothing. A record without recovery points is deleted, so that the retry
// runs afresh; one that holds some (SaveStep) is kept in flight with its
// lease ended at once, so that the retry takes it over and gets them.
//
// Both cases are one statement. Should a step be saved between its
// snapshot and its row lock (a step the handler left running after it
// returned), the delete, re-checked on the newest row, deletes nothing,
// and the record stays held until its lease ends, then is taken over with
// that step.
func (s *Store) Release(ctx context.Context, p idem.ReleaseParams) error {
	_, err := s.pool.Exec(ctx, releaseSQL, p.Tenant, p.Key, p.Token)
	if isUndefinedFunction(err) {
		// A schema without migration 0005: the statement was refused
		// before it ran. Release as the schema's completion notifies.
		_, err = s.pool.Exec(ctx, releaseSQLBefore0005, p.Tenant, p.Key, p.Token)
	}
	return interpretError(err)
}

// releaseSQL deletes the released record or ends its lease, whichever its
// recovery points call for; the two conditions exclude each other, so one
// row is never touched twice by the statement. When duplicates wait for
// the record (Watch set its waiters flag), it tells them, as idem_complete
// does, with the opaque token of migration 0005; a record nobody waits
// for calls no pg_notify.
const releaseSQL = `WITH gone AS (
	DELETE FROM idem_keys
	WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'in_flight' AND steps IS NULL
	RETURNING waiters
), ended AS (
	UPDATE idem_keys SET locked_until = now()
	WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'in_flight' AND steps IS NOT NULL
	RETURNING waiters
)
SELECT pg_notify('idem_keys_' || 'idem_keys'::regclass::oid::text, idem_notify_token($1, $2))
FROM (SELECT waiters FROM gone UNION ALL SELECT waiters FROM ended) AS changed
WHERE waiters`

// releaseSQLBefore0005 is releaseSQL on a schema migrated up to 0004,
// whose waiters listen for the md5 of the tenant followed by the key.
const releaseSQLBefore0005 = `WITH gone AS (
	DELETE FROM idem_keys
	WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'in_flight' AND steps IS NULL
	RETURNING waiters
), ended AS (
	UPDATE idem_keys SET locked_until = now()
	WHERE tenant_id = $1 AND idem_key = $2 AND lease_token = $3 AND state = 'in_flight' AND steps IS NOT NULL
	RETURNING waiters
)
SELECT pg_notify('idem_keys_' || 'idem_keys'::regclass::oid::text, md5($1) || $2)
FROM (SELECT waiters FROM gone UNION ALL SELECT waiters FROM ended) AS changed
WHERE waiters`

// isUndefinedFunction reports whether err is the server's refusal of a
// statement calling a function the schema lacks (42883).
func isUndefinedFunction(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42883"
}
