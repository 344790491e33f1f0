package idemredis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/idem-go/idem"
)

var _ idem.StateReader = (*Store)(nil)

// stateFields are the fields of a record's hash that GetState reads: all
// but the result and the recovery points, which may weigh megabytes.
var stateFields = []string{"tenant", "key", "state", "fingerprint", "token", "locked_until", "created_at", "expires_at", "completed_at"}

// GetState implements idem.StateReader: one HMGET of the fields that say
// where the record stands, for the engine's poller of a waited key.
// Records past their retention have been deleted by their TTL, so it
// returns idem.ErrNotFound for them, as Get does.
func (s *Store) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	values, err := s.client.HMGet(ctx, s.key(tenant, key), stateFields...).Result()
	if err != nil {
		return nil, fmt.Errorf("idemredis: get state: %w", err)
	}
	f := make(map[string]string, len(stateFields))
	for i, v := range values {
		if str, ok := v.(string); ok {
			f[stateFields[i]] = str
		}
	}
	if f["state"] == "" {
		// HMGET answers nil for every field of a missing hash.
		return nil, idem.ErrNotFound
	}
	return decodeState(f)
}

// decodeState builds a Record without result and steps from the fields of
// its hash, refusing what this package could not have written.
func decodeState(f map[string]string) (*idem.Record, error) {
	rec := &idem.Record{Tenant: f["tenant"], Key: f["key"], State: idem.State(f["state"])}
	if fp := f["fingerprint"]; fp != "" {
		rec.Fingerprint = []byte(fp)
	}
	switch rec.State {
	case idem.StateInFlight, idem.StateComplete:
	default:
		return nil, fmt.Errorf("idemredis: stored record has state %q", rec.State)
	}
	var err error
	if rec.LeaseToken, err = strconv.ParseInt(f["token"], 10, 64); err != nil {
		return nil, fmt.Errorf("idemredis: stored token: %w", err)
	}
	if rec.LockedUntil, err = parseMicros(f, "locked_until"); err != nil {
		return nil, err
	}
	if rec.CreatedAt, err = parseMicros(f, "created_at"); err != nil {
		return nil, err
	}
	if rec.ExpiresAt, err = parseMicros(f, "expires_at"); err != nil {
		return nil, err
	}
	if rec.State == idem.StateComplete {
		if rec.CompletedAt, err = parseMicros(f, "completed_at"); err != nil {
			return nil, err
		}
	}
	return rec, nil
}
