package idempg

import (
	"context"
	"time"

	"github.com/idem-go/idem"
)

var _ idem.StateReader = (*Store)(nil)

// stateSQL reads what GetState returns: no result, no steps, whose TOASTed
// values (a body, recovery points of a megabyte) a poll must not fetch.
const stateSQL = `SELECT fingerprint, state, lease_token, locked_until, created_at, completed_at, expires_at
	FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2`

// GetState implements idem.StateReader, for the engine's poller of a
// waited key: the record without its result and its recovery points.
func (s *Store) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	rec := &idem.Record{Tenant: tenant, Key: key}
	var state string
	var completed *time.Time
	err := s.pool.QueryRow(ctx, stateSQL, tenant, key).Scan(&rec.Fingerprint, &state, &rec.LeaseToken,
		&rec.LockedUntil, &rec.CreatedAt, &completed, &rec.ExpiresAt)
	if err != nil {
		return nil, interpretError(err)
	}
	rec.State = idem.State(state)
	rec.CompletedAt = deref(completed)
	if len(rec.Fingerprint) == 0 {
		rec.Fingerprint = nil
	}
	return rec, nil
}
