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
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[recordKey{tenant, key}]
	if e == nil {
		return nil, idem.ErrNotFound
	}
	rec := e.rec
	rec.Fingerprint = bytes.Clone(rec.Fingerprint)
	rec.Result = idem.Result{}
	rec.Steps = nil
	return &rec, nil
}
