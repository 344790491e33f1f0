package idemsql

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

var _ idem.StateReader = (*Store)(nil)

// GetState implements idem.StateReader, for the engine's poller of a
// waited key: the record without its result and its recovery points (nor,
// on SQLite, the step journal), which a poll must not fetch.
func (s *Store) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	rec, _, err := s.read(ctx, s.d.state, tenant, key)
	if err != nil {
		if errors.Is(err, idem.ErrNotFound) {
			return nil, err
		}
		return nil, fmt.Errorf("idemsql: get state: %w", err)
	}
	return rec, nil
}
