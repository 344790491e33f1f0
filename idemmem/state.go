package idemmem

import (
	"bytes"
	"context"

	"github.com/idem-go/idem"
)

var _ idem.StateReader = (*Store)(nil)

// GetState implements idem.StateReader: the record without its result
// and its recovery points, which Get copies out of the store.
func (s *Store) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sh, h := s.locate(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, tenant, key)
	if e == nil {
		return nil, idem.ErrNotFound
	}
	rec := &idem.Record{
		Tenant:      e.tenant,
		Key:         e.key,
		State:       idem.StateInFlight,
		LeaseToken:  e.token,
		LockedUntil: e.at(e.lockedUntil),
		CreatedAt:   e.createdAt,
		ExpiresAt:   e.at(e.expiresAt),
	}
	if len(e.fingerprint) > 0 {
		rec.Fingerprint = bytes.Clone(e.fingerprint)
	}
	if e.complete {
		rec.State = idem.StateComplete
		rec.CompletedAt = e.at(e.completedAt)
	}
	return rec, nil
}
