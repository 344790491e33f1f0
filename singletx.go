package idem

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// UnitClaimer is implemented by a store that can claim a key as the first
// statement of the unit of work, the single-transaction mode (idempg's
// Config.SingleTransaction). The engine uses it instead of Claim and Begin
// when the store's Info reports SingleTransaction.
//
// In that mode nothing is committed before the handler runs: the claim,
// the handler's writes and the completed record commit together, or not at
// all. The database's own lock is the lease, so there is no lease to
// extend (no heartbeat) and nothing to take over: when the holder dies,
// the database rolls its transaction back and the next claim runs afresh.
// No recovery points are kept (idem.Step is refused), since nothing of an
// execution outlives its transaction.
type UnitClaimer interface {
	// ClaimUnit claims p's key inside a new unit of work. When the key is
	// absent (or its record past retention) the claim is won and the unit
	// holds the key until it ends: its Complete writes the record with
	// the handler's writes, its Rollback frees the key. When another unit
	// holds the key, ClaimUnit waits for it to end, at most wait, then
	// answers as a claim made at that moment would (a lost claim returns
	// the record and a nil unit); past wait it returns an error wrapping
	// ErrInFlight. A zero wait does not wait.
	ClaimUnit(ctx context.Context, p ClaimParams, wait time.Duration) (ClaimResult, UnitOfWork, error)
}

// errStepsSingleTransaction is what idem.Step returns on a store in the
// single-transaction mode: nothing of an execution outlives its
// transaction there, so a step's record could not survive the crash it is
// meant for. It wraps ErrStepsUnsupported.
var errStepsSingleTransaction = fmt.Errorf("idem: recovery points are not kept in the single-transaction mode (a step's record would roll back with the crash it is for); use the default mode for handlers with steps: %w", ErrStepsUnsupported)

// doInUnit is Do on a store in the single-transaction mode.
func (e *Engine) doInUnit(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error), t *opTrace) (Outcome, error) {
	token := newToken()
	claim, unit, err := e.claimWaiting(ctx, op, token)
	if err != nil {
		// Nothing of a failed claim is committed (the claim commits only
		// with the completion), so there is nothing to release.
		if errors.Is(err, ErrInFlight) {
			return Outcome{}, ErrInFlight
		}
		if op.WaitContext != nil && errors.Is(err, op.WaitContext.Err()) {
			return Outcome{}, err
		}
		return Outcome{}, storeError("claim", err)
	}
	if !claim.Won {
		if op.WaitInFlight > 0 && waitable(claim.Record, op.Fingerprint) {
			// A committed in-flight record: an execution of a store in
			// the default mode on the same table.
			return e.waitInFlight(ctx, op, claim.Record, fn, t)
		}
		if t != nil && claim.Record != nil {
			t.completedAt = claim.Record.CompletedAt
		}
		return decide(claim.Record, op.Fingerprint)
	}
	if unit == nil {
		return Outcome{}, storeError("claim", errors.New("claim won without a unit of work"))
	}
	return e.run(ctx, op, token, &claim, unit, fn, t)
}

// claimWaiting claims op in a unit of work. The claim is where a
// duplicate waits in this mode, so it also ends when op.WaitContext does,
// as the engine's own wait would.
func (e *Engine) claimWaiting(ctx context.Context, op Operation, token int64) (ClaimResult, UnitOfWork, error) {
	if op.WaitContext == nil || op.WaitInFlight <= 0 {
		return e.claimUnit(ctx, e.claimParams(op, token), op.WaitInFlight)
	}
	claimCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(op.WaitContext, func() { cancel(context.Cause(op.WaitContext)) })
	defer stop()
	claim, unit, err := e.claimUnit(claimCtx, e.claimParams(op, token), op.WaitInFlight)
	if err != nil && ctx.Err() == nil && op.WaitContext.Err() != nil {
		// The waiting caller left: say so, as a wait that ends does.
		return claim, unit, context.Cause(op.WaitContext)
	}
	return claim, unit, err
}

func (e *Engine) claimUnit(ctx context.Context, p ClaimParams, wait time.Duration) (ClaimResult, UnitOfWork, error) {
	if e.storeTracer == nil {
		return e.unitClaimer.ClaimUnit(ctx, p, wait)
	}
	ctx, s := startStore(ctx, e.storeTracer, StoreClaim, e.info.Name)
	res, unit, err := e.unitClaimer.ClaimUnit(ctx, p, wait)
	s.end(ctx, err)
	return res, unit, err
}
