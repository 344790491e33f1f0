package idempg

import (
	"context"

	"github.com/idem-go/idem"
)

// defaultPurgeLimit is idem.PurgeParams' documented default.
const defaultPurgeLimit = 1000

// purgeSQL deletes one bounded batch of expired records.
//
// The inner SELECT walks idem_keys_expires_at_idx in expires_at order and
// stops after $1 rows; FOR UPDATE SKIP LOCKED passes over rows that a
// claim (a takeover of an expired key) holds at that instant instead of
// waiting for it, and locks the rest, so that the outer DELETE, which
// finds them by ctid (a TID scan, no second index lookup), deletes exactly
// the rows that were checked. A claim that meets a locked row waits for
// this one statement only, then inserts afresh.
const purgeSQL = `DELETE FROM idem_keys WHERE ctid = ANY(ARRAY(
	SELECT ctid FROM idem_keys
	WHERE expires_at <= now() AND (state = 'complete' OR locked_until <= now())
	ORDER BY expires_at
	LIMIT $1
	FOR UPDATE SKIP LOCKED))`

// Purge implements idem.Store: it deletes at most p.Limit records whose
// retention has passed and that hold no live lease.
func (s *Store) Purge(ctx context.Context, p idem.PurgeParams) (int, error) {
	limit := p.Limit
	if limit <= 0 {
		limit = defaultPurgeLimit
	}
	tag, err := s.pool.Exec(ctx, purgeSQL, limit)
	if err != nil {
		return 0, interpretError(err)
	}
	return int(tag.RowsAffected()), nil
}
