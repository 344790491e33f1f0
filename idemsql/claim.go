package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// claimAttempts bounds the retries of a claim whose record vanished
// between the claim and the read that follows a lost claim (released or
// purged in between): the next attempt normally wins.
const claimAttempts = 3

// Claim implements idem.Store.
//
// It first reads the record (peek): a replay, whose record is complete
// and within its retention, costs that one read, which takes no lock and
// waits for none; a claim would only lose to the record and read it
// again. Nothing but the passing of its retention changes a complete
// record, and the read decides that on the database clock, so the answer
// is the one a claim would give at that instant.
//
// Otherwise the claim is one statement (INSERT … ON CONFLICT … DO UPDATE
// … WHERE, or ON DUPLICATE KEY UPDATE on MySQL), followed, when it lost,
// by one read of the record that holds the key. On SQLite a key without a
// record is claimed by one INSERT, and one with a record in one
// transaction that holds the write lock (claimExisting).
func (s *Store) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	if s.d.maxTenant > 0 && len(p.Tenant) > s.d.maxTenant {
		return idem.ClaimResult{}, idem.NotApplied(fmt.Errorf("idemsql: claim: the tenant is %d bytes long, the %s table holds %d", len(p.Tenant), s.d.name, s.d.maxTenant))
	}
	if s.d.checkTenant != nil {
		if err := s.d.checkTenant(p.Tenant); err != nil {
			return idem.ClaimResult{}, idem.NotApplied(err)
		}
	}
	if s.d.claimFolded != nil {
		if res, ok, err := s.d.claimFolded(s, ctx, p); ok {
			return res, err
		}
	}
	rec, replay, err := s.peek(ctx, p.Tenant, p.Key)
	if err != nil {
		// A read: nothing was claimed.
		return idem.ClaimResult{}, idem.NotApplied(fmt.Errorf("idemsql: claim: %w", err))
	}
	if replay {
		return idem.ClaimResult{Record: rec}, nil
	}
	args := s.d.claim.args(map[string]any{
		"tenant":      p.Tenant,
		"key":         p.Key,
		"fingerprint": nullBytes(p.Fingerprint),
		"token":       p.Token,
		"lease":       p.Lease.Microseconds(),
		"retention":   p.Retention.Microseconds(),
	})
	for range claimAttempts {
		var out claimOutcome
		err := s.retry(ctx, func() (err error) {
			out, err = s.d.claimOnce(s, ctx, p, args, rec != nil)
			return err
		})
		if err != nil {
			err = fmt.Errorf("idemsql: claim: %w", err)
			if ctx.Err() == nil {
				// Otherwise the database may run the statement after all
				// (it was cancelled after it was sent): the engine then
				// releases what it may claim, fenced by the token.
				err = idem.NotApplied(err)
			}
			return idem.ClaimResult{}, err
		}
		if out.won {
			return s.won(ctx, p, out)
		}
		if out.record != nil {
			return idem.ClaimResult{Record: out.record}, nil
		}
		holder, _, err := s.read(ctx, s.d.get, p.Tenant, p.Key)
		if errors.Is(err, idem.ErrNotFound) {
			continue
		}
		if err != nil {
			return idem.ClaimResult{}, fmt.Errorf("idemsql: get: %w", err)
		}
		return idem.ClaimResult{Record: holder}, nil
	}
	return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: the record vanished %d times between claim and read", claimAttempts)
}

// claimOutcome is what one run of a claim found.
type claimOutcome struct {
	won      bool
	takeover bool
	// steps are the takeover's recovery points, encoded; stepsKnown is
	// false when they are still to be read (MySQL, see stepsOf).
	steps      []byte
	stepsKnown bool
	// record is the record that beat a lost claim, when the claim read
	// it (SQLite); otherwise Claim reads it.
	record *idem.Record
}

// peek reads the record of (tenant, key) before a claim, and whether it
// is complete and within its retention. It returns a nil record when
// there is none.
func (s *Store) peek(ctx context.Context, tenant, key string) (*idem.Record, bool, error) {
	var replay bool
	rec, _, err := s.read(ctx, s.d.peek, tenant, key, &replay)
	if errors.Is(err, idem.ErrNotFound) {
		return nil, false, nil
	}
	return rec, replay, err
}

// read runs q, a select of recordColumns (and extra) by tenant and key,
// on the pool. It returns the steps as stored, undecoded.
func (s *Store) read(ctx context.Context, q query, tenant, key string, extra ...any) (*idem.Record, []byte, error) {
	row := s.prepared(ctx, q).QueryRowContext(ctx, q.args(map[string]any{"tenant": tenant, "key": key})...)
	rec, steps, err := scanRecord(s.d, row, extra...)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil, idem.ErrNotFound
	}
	if err != nil {
		return nil, nil, err
	}
	return rec, steps, nil
}

// won turns a won claim into its result, reading a MySQL takeover's
// steps. The key is held from here on: an error is not ErrNotApplied, so
// that the engine releases it (and Release keeps the steps).
func (s *Store) won(ctx context.Context, p idem.ClaimParams, out claimOutcome) (idem.ClaimResult, error) {
	if out.takeover && !out.stepsKnown {
		err := s.prepared(ctx, s.d.stepsOf).QueryRowContext(ctx, s.d.stepsOf.args(map[string]any{
			"tenant": p.Tenant, "key": p.Key, "token": p.Token,
		})...).Scan(&out.steps)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: read the steps: %w", err)
		}
	}
	steps, err := decodeSteps(out.steps)
	if err != nil {
		// Never run the recorded steps again for want of reading them.
		return idem.ClaimResult{}, fmt.Errorf("idemsql: claim: the recorded steps: %w", err)
	}
	return idem.ClaimResult{Won: true, Takeover: out.takeover, Steps: steps}, nil
}

// claimStatement is rules.claimOnce where the claim is one statement
// (MySQL, PostgreSQL).
func (s *Store) claimStatement(ctx context.Context, _ idem.ClaimParams, args []any, _ bool) (claimOutcome, error) {
	// A statement prepared once on the pool: MySQL's driver otherwise
	// prepares, executes and closes the statement at every claim, two
	// round trips and a packet instead of one round trip.
	claim := s.prepared(ctx, s.d.claim)
	if s.d.claimReturns {
		var out claimOutcome
		var token int64
		err := claim.QueryRowContext(ctx, args...).Scan(&token, &out.steps, &out.takeover)
		if errors.Is(err, sql.ErrNoRows) {
			return claimOutcome{}, nil
		}
		out.won, out.stepsKnown = err == nil, true
		return out, err
	}
	res, err := claim.ExecContext(ctx, args...)
	if err != nil {
		return claimOutcome{}, err
	}
	// See mysqlDialect.claim: 0 lost, 1 won, 2 won by a takeover.
	id, err := res.LastInsertId()
	return claimOutcome{won: id == 1 || id == 2, takeover: id == 2, stepsKnown: id != 2}, err
}

// claimValues are the named arguments of a claim.
func claimValues(p idem.ClaimParams) map[string]any {
	return map[string]any{
		"tenant":      p.Tenant,
		"key":         p.Key,
		"fingerprint": nullBytes(p.Fingerprint),
		"token":       p.Token,
		"lease":       p.Lease.Microseconds(),
		"retention":   p.Retention.Microseconds(),
	}
}
