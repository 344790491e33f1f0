package idemsql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// The single-transaction mode (SingleTransaction): nothing is committed
// before the handler runs. The claim is the first statement of the
// handler's transaction, so the key's record is written, in flight, by
// that transaction, and is seen by no one else until it commits complete:
// the row's lock (SQLite: the database's only write lock) is the lease. A
// duplicate's claim waits on that lock, bounded by its wait limit: when
// the holder commits, it loses to the complete record and replays it;
// when the holder rolls back, or its process dies and the server rolls
// its transaction back, it claims afresh. See "Single-transaction mode"
// in the package documentation and docs/BENCHMARKS.md.
//
// The claim is the default mode's own claim statement, run inside the
// transaction rather than in one of its own: on PostgreSQL and MySQL an
// INSERT that meets a row another transaction inserted and has not
// committed waits for that transaction on the unique index, then sees its
// outcome, which is the duplicate's wait; on SQLite BEGIN IMMEDIATE lets
// one transaction write at a time. The completion is the default mode's
// UPDATE of the record in the same transaction, then its COMMIT.

// Option configures a Store (NewStore).
type Option func(*Store)

// SingleTransaction puts the Store in the single-transaction mode, as
// idempg's Config.SingleTransaction does: the engine claims each key as
// the first statement of the handler's transaction (idem.UnitClaimer),
// and the claim commits with the handler's writes and the answer, in one
// commit per request, or not at all. A duplicate waits for the first
// execution's transaction, at most its wait limit
// (idem.Operation.WaitInFlight), then replays its answer; past the limit
// it gets idem.ErrInFlight. There is no lease to extend and nothing to take
// over: the database rolls a dead holder's transaction back. Recovery
// points are refused (idem.ErrStepsUnsupported), and an execution
// in flight is invisible to Get, Watch and idem inspect until it commits.
//
// Store.Claim and Store.Begin keep the default mode's behaviour, for other
// callers of the table.
func SingleTransaction() Option {
	return func(s *Store) { s.single = &singleMode{} }
}

// singleMode is the state of a Store in the single-transaction mode.
type singleMode struct {
	// held counts, on SQLite, this Store's claims and executions of a key,
	// by tenant and key, from the moment a claim begins: a claim of a key
	// another claim or execution holds is a duplicate, whose wait for the
	// write lock is bounded by its wait limit, while a claim of another
	// key waits for the lock as any writer does. Counted from the claim's
	// beginning, not from its win: duplicates sent at once all queue for
	// the lock before the first wins it.
	mu   sync.Mutex
	held map[lease]int
}

// hold marks (tenant, key) held by a claim of this Store, reports whether
// another claim or execution held it already, and returns what unmarks
// it.
func (m *singleMode) hold(tenant, key string) (others bool, unhold func()) {
	k := lease{tenant: tenant, key: key}
	m.mu.Lock()
	if m.held == nil {
		m.held = make(map[lease]int)
	}
	others = m.held[k] > 0
	m.held[k]++
	m.mu.Unlock()
	var once sync.Once
	return others, func() {
		once.Do(func() {
			m.mu.Lock()
			if m.held[k]--; m.held[k] <= 0 {
				delete(m.held, k)
			}
			m.mu.Unlock()
		})
	}
}

// singleDeadlockAttempts bounds the claims of one ClaimUnit that end in a
// deadlock (see ClaimUnit).
const singleDeadlockAttempts = 20

// ClaimUnit implements idem.UnitClaimer, the claim of the
// single-transaction mode. It first reads the record outside any
// transaction: a replay costs that one read. Otherwise it begins the
// handler's transaction and claims in it; when another execution's
// transaction holds the key, the claim waits for it, at most wait, then
// answers as a claim made at that moment would: the holder's answer when
// it committed, a claim of its own when it rolled back. Past wait it
// returns idem.ErrInFlight. A zero wait does not wait for a held key.
//
// It fails on a Store in the default mode, whose engine claims with Claim.
func (s *Store) ClaimUnit(ctx context.Context, p idem.ClaimParams, wait time.Duration) (idem.ClaimResult, idem.UnitOfWork, error) {
	if s.single == nil {
		return idem.ClaimResult{}, nil, idem.NotApplied(errors.New("idemsql: ClaimUnit needs the SingleTransaction option"))
	}
	if s.d.maxTenant > 0 && len(p.Tenant) > s.d.maxTenant {
		return idem.ClaimResult{}, nil, idem.NotApplied(fmt.Errorf("idemsql: claim: the tenant is %d bytes long, the %s table holds %d", len(p.Tenant), s.d.name, s.d.maxTenant))
	}
	rec, replay, err := s.peek(ctx, p.Tenant, p.Key)
	if err != nil {
		return idem.ClaimResult{}, nil, idem.NotApplied(fmt.Errorf("idemsql: claim: %w", err))
	}
	if replay {
		return idem.ClaimResult{Record: rec}, nil, nil
	}
	deadline := time.Now().Add(wait)
	if rec == nil && s.d.claimUnitNew != nil {
		u, err := s.d.claimUnitNew(s, ctx, p, wait)
		if err != nil {
			if errors.Is(err, idem.ErrInFlight) {
				return idem.ClaimResult{}, nil, err
			}
			// Nothing of a failed claim is committed.
			return idem.ClaimResult{}, nil, idem.NotApplied(fmt.Errorf("idemsql: claim: %w", err))
		}
		if u != nil {
			return idem.ClaimResult{Won: true}, u, nil
		}
	}
	for attempt, vanished := 1, 0; vanished < claimAttempts; attempt++ {
		left := max(time.Until(deadline), 0)
		u, rec, err := s.claimUnit(ctx, p, left, s.singleLockWait(left))
		if err != nil && s.d.retryable(err) && attempt < singleDeadlockAttempts && ctx.Err() == nil {
			// InnoDB: duplicates waiting on a row whose inserter rolled
			// back meet in a deadlock, and all but one are rolled back.
			// Nothing was claimed: claim again, within the same wait.
			pause := time.Duration(rand.Int64N(int64(attempt) * int64(2*time.Millisecond)))
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
			continue
		}
		if err != nil {
			// Nothing of a failed claim is committed.
			if errors.Is(err, idem.ErrInFlight) {
				return idem.ClaimResult{}, nil, err
			}
			return idem.ClaimResult{}, nil, idem.NotApplied(fmt.Errorf("idemsql: claim: %w", err))
		}
		if u != nil {
			return idem.ClaimResult{Won: true, Takeover: u.takeover}, u, nil
		}
		if rec != nil {
			return idem.ClaimResult{Record: rec}, nil, nil
		}
		// Lost to a record the claim did not read: read it now, outside
		// the transaction, which has ended.
		holder, _, err := s.read(ctx, s.d.get, p.Tenant, p.Key)
		if errors.Is(err, idem.ErrNotFound) {
			vanished++
			continue // purged since: claim again
		}
		if err != nil {
			return idem.ClaimResult{}, nil, idem.NotApplied(fmt.Errorf("idemsql: get: %w", err))
		}
		return idem.ClaimResult{Record: holder}, nil, nil
	}
	return idem.ClaimResult{}, nil, idem.NotApplied(fmt.Errorf("idemsql: claim: the record vanished %d times between claim and read", claimAttempts))
}

// claimUnit begins a transaction and claims p's key in it, waiting at
// most lockWait for SQLite's write lock held by another process (0: the
// busy timeout; see unit.lockWait). It returns the unit holding the key
// when the claim won; otherwise the transaction is
// rolled back, and it returns the record the claim lost to when it read
// it (SQLite), or neither (then the caller reads it).
func (s *Store) claimUnit(ctx context.Context, p idem.ClaimParams, wait, lockWait time.Duration) (*singleUnit, *idem.Record, error) {
	u := newUnit(s)
	u.lockWait = lockWait
	beginCtx, cancel, unhold := s.duplicateWait(ctx, p, wait)
	defer cancel()
	won := false
	defer func() {
		if !won {
			unhold()
		}
	}()
	u.mu.Lock()
	err := u.begin(beginCtx)
	u.mu.Unlock()
	if err != nil {
		if beginCtx != ctx && ctx.Err() == nil && beginCtx.Err() != nil {
			return nil, nil, fmt.Errorf("idemsql: %w (waited %s for its transaction)", idem.ErrInFlight, wait)
		}
		return nil, nil, err // idem.ErrInFlight when another process held the write lock past wait
	}
	won, takeover, rec, err := s.claimIn(ctx, u.conn, p, wait)
	if err != nil || !won {
		_ = u.Rollback(ctx)
		return nil, rec, err
	}
	won = true
	return &singleUnit{u: u, params: p, takeover: takeover, unhold: unhold}, nil, nil
}

// duplicateWait returns the context of the beginning of a claim's
// transaction, and what ends the claim's hold on the key (see
// singleMode.held), which the claim keeps when it wins: on SQLite, for a
// duplicate of a claim or execution of this Store, the write lock it
// waits for is the holder's, so the wait limit bounds the wait; otherwise
// ctx.
func (s *Store) duplicateWait(ctx context.Context, p idem.ClaimParams, wait time.Duration) (context.Context, context.CancelFunc, func()) {
	if !s.d.oneWriter {
		return ctx, func() {}, func() {}
	}
	others, unhold := s.single.hold(p.Tenant, p.Key)
	if others {
		ctx, cancel := context.WithTimeout(ctx, max(wait, time.Millisecond))
		return ctx, cancel, unhold
	}
	return ctx, func() {}, unhold
}

// singleMinLockWait is the shortest wait singleLockWait gives a claim
// for SQLite's write lock held by another process: the holder may run
// another key, and a claim of a fresh key must not give up at once
// behind every short transaction there.
const singleMinLockWait = 100 * time.Millisecond

// singleLockWait is how long a claim of the single-transaction mode waits
// for SQLite's write lock once this Store's own writers let it through
// (unit.lockWait): its wait limit, at least singleMinLockWait. Another
// process's transaction holds the lock, perhaps a duplicate's execution,
// perhaps another key's; past the limit the claim gets idem.ErrInFlight
// rather than the busy timeout's wait. 0 elsewhere than on SQLite.
func (s *Store) singleLockWait(wait time.Duration) time.Duration {
	if !s.d.oneWriter {
		return 0
	}
	return max(wait, singleMinLockWait)
}

// claimIn runs the claim on conn, in its open transaction
// (rules.claimIn).
func (s *Store) claimIn(ctx context.Context, conn *sql.Conn, p idem.ClaimParams, wait time.Duration) (won, takeover bool, rec *idem.Record, err error) {
	values := map[string]any{
		"tenant":      p.Tenant,
		"key":         p.Key,
		"fingerprint": nullBytes(p.Fingerprint),
		"token":       p.Token,
		"lease":       p.Lease.Microseconds(),
		"retention":   p.Retention.Microseconds(),
	}
	return s.d.claimIn(s, ctx, conn, values, wait)
}

// singleUnit is the unit of work of a claim in the single-transaction
// mode: the handler's transaction, whose first statement claimed the key.
// The handler reaches it as it reaches any unit's; it completes and rolls
// back its own way.
type singleUnit struct {
	u        *unit
	params   idem.ClaimParams
	takeover bool
	unhold   func() // SQLite: unmarks the key held
}

var _ idem.UnitOfWork = (*singleUnit)(nil)

// Context implements idem.UnitOfWork.
func (w *singleUnit) Context(ctx context.Context) context.Context { return w.u.Context(ctx) }

// Rollback implements idem.UnitOfWork: the transaction, the claim with it,
// is rolled back, which frees the key. Harmless after Complete.
func (w *singleUnit) Rollback(ctx context.Context) error {
	defer w.done()
	return w.u.Rollback(ctx)
}

func (w *singleUnit) done() {
	if w.unhold != nil {
		w.unhold()
	}
}

// Complete implements idem.UnitOfWork: the record is completed in the
// transaction, which then commits. When the business writes cannot commit
// (the handler rolled its transaction back, a failed statement aborted it
// on PostgreSQL, or the engine asks for the answer alone: WithoutWrites),
// the transaction, its claim with it, is rolled back, and a new one claims
// the key again and stores the answer alone; when another execution
// claimed the key in between, Complete returns idem.ErrLeaseLost, and
// nothing of this one is stored. A success over aborted writes is not
// stored (idem.ErrWritesAborted).
func (w *singleUnit) Complete(ctx context.Context, p idem.CompleteParams) (err error) {
	defer w.done()
	u, s := w.u, w.u.s
	u.stmts.Lock()
	u.mu.Lock()
	state := u.state
	u.state = unitDone
	alone := false
	switch state {
	case unitEnded:
		u.mu.Unlock()
		u.stmts.Unlock()
		return &TxEndedError{Cause: u.cause}
	case unitDone:
		u.mu.Unlock()
		u.stmts.Unlock()
		return errUnitDone
	case unitOpen:
		if p.WithoutWrites {
			u.finish(ctx)
			alone = true
			break
		}
		err = u.complete(ctx, p)
		if errors.Is(err, errAborted) {
			if p.Result.Status < 400 {
				err = idem.ErrWritesAborted
			} else {
				alone = true
			}
		}
	default: // rolled back by the handler (or never begun)
		alone = true
	}
	u.mu.Unlock()
	u.stmts.Unlock()
	if alone {
		err = s.completeAloneSingle(ctx, w.params, p)
	}
	if err == nil {
		s.changed(p.Tenant, p.Key)
	}
	return err
}

// completeAloneSingle stores the answer without the handler's writes: a
// new transaction claims the key again, under the same token, and
// completes it. It does not wait for another execution that claimed the
// key meanwhile: that one runs the operation, and this one stored nothing
// (idem.ErrLeaseLost).
func (s *Store) completeAloneSingle(ctx context.Context, cp idem.ClaimParams, p idem.CompleteParams) error {
	// The answer must be stored: wait for SQLite's write lock as any
	// writer does (lockWait 0), not as a duplicate.
	u, _, err := s.claimUnit(ctx, cp, 0, 0)
	if errors.Is(err, idem.ErrInFlight) {
		return fmt.Errorf("idemsql: complete: the key was claimed by another execution meanwhile: %w", idem.ErrLeaseLost)
	}
	if err != nil {
		return fmt.Errorf("idemsql: complete: %w", err)
	}
	if u == nil {
		return fmt.Errorf("idemsql: complete: the key was claimed by another execution meanwhile: %w", idem.ErrLeaseLost)
	}
	defer u.done()
	u.u.mu.Lock()
	defer u.u.mu.Unlock()
	u.u.state = unitDone
	return u.u.complete(ctx, p)
}

var _ idem.UnitClaimer = (*Store)(nil)
