package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// execution is one run of fn under a won claim.
type execution struct {
	e     *Engine
	ctx   context.Context // the caller's
	op    Operation
	token int64
	unit  UnitOfWork
	// hctx is the handler's context: the unit's, carrying st
	// (ExecutionFromContext, NotExecuted, RollbackWrites, Step), cancelled
	// with cause ErrLeaseLost when the heartbeat finds the lease lost and
	// without one (context.Canceled) once the handler has returned.
	hctx   context.Context
	cancel context.CancelCauseFunc // hctx's
	st     execState
	held   bool  // the heartbeat keeps the lease
	lease  lease // what the heartbeat keeps of it, under its lock
}

// run runs fn under a won claim, in unit when the claim began it
// (UnitClaimer), else in a unit of work begun here.
func (e *Engine) run(ctx context.Context, op Operation, token int64, claim *ClaimResult, unit UnitOfWork, fn func(ctx context.Context) (Result, error), t *opTrace) (Outcome, error) {
	if unit == nil {
		var err error
		if unit, err = e.begin(ctx); err != nil {
			e.release(ctx, op, token)
			return Outcome{}, storeError("begin", err)
		}
	}
	x := &execution{e: e, ctx: ctx, op: op, token: token, unit: unit}
	hctx, cancel := context.WithCancelCause(unit.Context(ctx))
	x.hctx, x.cancel = context.WithValue(hctx, execKey{}, &x.st), cancel
	x.st.info = Execution{Tenant: op.Tenant, Key: op.Key, LeaseToken: token, Store: e.info.Name, Takeover: claim.Takeover}
	x.st.initSteps(e, op, unit, claim.Steps)
	if e.unitClaimer != nil {
		x.st.stepsRefused = errStepsSingleTransaction
	}
	if e.keeper != nil {
		x.held = true
		e.keeper.add(x)
	}

	// fn returns, panics (recovered by callHandler) or ends its goroutine
	// with runtime.Goexit, which no recover sees: only this deferred call
	// runs then, and it must not leave the key held and kept alive by the
	// heartbeat for as long as the engine lives.
	returned := false
	defer func() {
		if !returned {
			x.st.endSteps()
			x.stopLease()
			x.abandon(errGoexit)
		}
	}()
	res, err := callHandler(x.hctx, fn)
	returned = true
	x.st.endSteps()
	return x.finish(res, err)
}

// errGoexit stands for the handler's runtime.Goexit in logs.
var errGoexit = errors.New("idem: the handler's goroutine exited (runtime.Goexit)")

// stopLease takes the lease off the heartbeat, ends the handler's context,
// and reports whether the heartbeat found the lease lost.
func (x *execution) stopLease() (lost bool) {
	x.cancel(nil)
	if !x.held {
		return false
	}
	lost = x.e.keeper.remove(x)
	x.held = false
	return lost
}

// finish decides what becomes of an execution whose function returned or
// panicked.
func (x *execution) finish(res Result, err error) (Outcome, error) {
	var panicked *PanicError
	if x.savesLater() {
		// A step ran and its record failed: the engine keeps the lease
		// and records it later (saveLater). Whatever the handler
		// answered is discarded, as below.
		cause := *x.st.unsavedStep.Load()
		if errors.As(err, &panicked) {
			return Outcome{}, err
		}
		return Outcome{}, cause
	}
	lost := x.stopLease()
	switch {
	case lost:
		// The heartbeat found the lease taken over, and cancelled the
		// handler's context: report that. The key belongs to another
		// execution now, so there is nothing to release.
		x.rollback("lease lost", ErrLeaseLost)
		x.e.lostLease(x.ctx, x.op, "heartbeat")
		x.warnStepsKept("lease lost", ErrLeaseLost)
		return Outcome{}, ErrLeaseLost
	case x.stepLostLease() != nil:
		// The store refused a step's record because the key was taken
		// over: the lease is lost as surely as if the heartbeat had found
		// it, and the key is the takeover's, which may have completed it.
		cause := x.lostAtStep()
		if errors.As(err, &panicked) {
			return Outcome{}, err
		}
		return Outcome{}, cause
	case x.st.unsavedStep.Load() != nil:
		// A step's effect happened and its record did not, whatever the
		// handler answered after that (a front end's handler cannot
		// return the error), even a panic: a retry now would repeat the
		// effect at once. The key stays held until its lease ends, which
		// gives the store time to come back; the takeover then runs the
		// step again, under the same downstream key (DownstreamKey).
		cause := x.keepUnsaved()
		if errors.As(err, &panicked) {
			return Outcome{}, err
		}
		return Outcome{}, cause
	case errors.As(err, &panicked):
		x.abandon(err)
		return Outcome{}, err
	case err == nil && x.st.notExecuted.Load():
		// The function says it did nothing: keep nothing, free the key.
		x.rollback("", nil)
		x.release("the handler marked its answer NotExecuted after it recorded steps", nil)
		return Outcome{Result: res, NotStored: true}, nil
	case x.ctx.Err() != nil:
		return x.cancelled(res, err)
	case err != nil:
		// The function failed and says so: nothing of it is to be kept.
		x.rollback("the handler failed", err)
		x.release("the handler failed", err)
		return Outcome{}, err
	}
	return x.complete(x.ctx, res)
}

// cancelled ends an execution whose caller's context ended while the
// function ran.
func (x *execution) cancelled(res Result, err error) (Outcome, error) {
	e := x.e
	cause := x.ctx.Err()
	if e.info.Transactional {
		x.rollback("the caller's context ended", cause)
		x.release("the caller's context ended", cause)
		if err == nil {
			err = cause
		}
		return Outcome{}, err
	}
	// Nothing can be undone: the function's effects stand, so its answer
	// must be what every retry gets.
	if err != nil {
		x.keepInFlight("the caller's context ended and the handler returned no answer", err)
		return Outcome{}, err
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(x.ctx), e.config.CleanupTimeout)
	defer cancel()
	out, cerr := x.complete(ctx, res)
	if cerr != nil {
		return out, cerr
	}
	// The answer is stored; the caller is gone, and gets it on its retry.
	return out, cause
}

// complete stores res and commits the unit of work.
func (x *execution) complete(ctx context.Context, res Result) (Outcome, error) {
	e := x.e
	withoutWrites := x.st.rollbackWrites.Load() && e.info.Transactional
	if withoutWrites && e.unitClaimer != nil {
		// The claim is in the unit of work: rolling it back would free
		// the key. The unit rolls the writes back and stores the answer
		// alone itself (CompleteParams.WithoutWrites).
		err := e.completeUnit(ctx, x.unit, CompleteParams{Tenant: x.op.Tenant, Key: x.op.Key, Token: x.token, Result: res, WithoutWrites: true})
		return x.completed(ctx, res, err)
	}
	if withoutWrites {
		// Store the answer without the business writes: roll them back and
		// complete in a unit of work of its own.
		if err := e.rollbackUnit(ctx, x.unit); err != nil {
			x.release("the rollback of the business writes failed", err)
			return Outcome{}, storeError("rollback", err)
		}
		next, err := e.begin(ctx)
		if err != nil {
			x.release("the unit of work for the answer could not begin", err)
			return Outcome{}, storeError("begin", err)
		}
		x.unit = next
	}
	err := e.completeUnit(ctx, x.unit, CompleteParams{Tenant: x.op.Tenant, Key: x.op.Key, Token: x.token, Result: res})
	return x.completed(ctx, res, err)
}

// completed ends an execution after its Complete returned err.
func (x *execution) completed(ctx context.Context, res Result, err error) (Outcome, error) {
	e := x.e
	if err == nil {
		return Outcome{Result: res}, nil
	}
	_ = e.rollbackUnit(context.WithoutCancel(ctx), x.unit)
	if errors.Is(err, ErrWritesAborted) {
		// The handler's own failure, not the store's: it answered a
		// success whose writes a failed statement had undone.
		x.e.config.Logger.ErrorContext(x.ctx, "idem: the handler answered a success after a failed statement aborted its transaction; nothing stored, key released",
			slog.String("store", e.info.Name), tenantAttr(x.op.Tenant), slog.String("key", x.op.Key), slog.Int("status", res.Status))
		e.release(x.ctx, x.op, x.token)
		return Outcome{}, err
	}
	if errors.Is(err, ErrLeaseLost) {
		e.lostLease(x.ctx, x.op, "completion")
		e.warnRolledBack(x.ctx, x.op, "lease lost at completion", err)
		x.warnStepsKept("lease lost at completion", err)
		return Outcome{}, ErrLeaseLost
	}
	if !e.info.Transactional {
		// The completion may have been refused (a full Redis) while the
		// effects stand: releasing would run them again on the retry.
		x.keepInFlight("the completion failed", err)
		return Outcome{}, storeError("complete", err)
	}
	// The commit may or may not have happened (a connection lost
	// mid-commit). Release is fenced on the in-flight state and the
	// token, so it deletes nothing if the completion did commit.
	e.warnRolledBack(x.ctx, x.op, "the completion failed", err)
	x.release("the completion failed", err)
	return Outcome{}, storeError("complete", err)
}

// stepLostLease returns, when a step ran and was not recorded and the
// lease is known lost (the store refused that step's record, or a later
// one's, after a takeover), the error to end the execution with, wrapping
// ErrLeaseLost; nil otherwise.
func (x *execution) stepLostLease() error {
	p := x.st.unsavedStep.Load()
	switch {
	case p == nil:
		return nil
	case errors.Is(*p, ErrLeaseLost):
		return *p
	case x.st.lost.Load():
		return fmt.Errorf("%w; before that, %w", ErrLeaseLost, *p)
	}
	return nil
}

// lostAtStep ends an execution whose step the store refused after a
// takeover: rolled back, counted and logged as a lost lease, nothing
// released or kept (the key is the takeover's). It returns the step's
// error, which wraps ErrLeaseLost and ErrStepNotSaved.
func (x *execution) lostAtStep() error {
	cause := x.stepLostLease()
	x.rollback("lease lost", cause)
	x.e.lostLease(x.ctx, x.op, "step")
	x.warnStepsKept("lease lost", cause)
	return cause
}

// keepUnsaved ends an execution in which a step ran and was not
// recorded: its writes rolled back, its key in flight until the lease
// ends. It returns the step's error.
func (x *execution) keepUnsaved() error {
	cause := *x.st.unsavedStep.Load()
	reason := "a step ran but was not recorded"
	if errors.Is(cause, ErrOutcomeUnknown) {
		reason = "the handler's outcome is unknown (OutcomeUnknown)"
	}
	x.rollback(reason, cause)
	x.keepInFlight(reason, cause)
	return cause
}

// abandon ends an execution whose function panicked or ended its
// goroutine: rolled back and released on a transactional store; on
// another, its effects may stand, so the key stays in flight until the
// lease ends, as it does on any store when a step ran and was not
// recorded.
func (x *execution) abandon(cause error) {
	if x.stepLostLease() != nil {
		x.lostAtStep()
		return
	}
	if x.st.unsavedStep.Load() != nil {
		x.keepUnsaved()
		return
	}
	if !x.e.info.Transactional {
		_ = x.e.rollbackUnit(context.WithoutCancel(x.ctx), x.unit)
		x.keepInFlight("the handler did not return", cause)
		return
	}
	x.rollback("the handler did not return", cause)
	x.release("the handler did not return", cause)
}

// release gives the key back after a failed execution: a record that
// holds steps is kept by the store, its lease ended, which warnStepsKept
// says.
func (x *execution) release(reason string, cause error) {
	x.warnStepsKept(reason, cause)
	x.e.release(x.ctx, x.op, x.token)
}

// warnStepsKept logs, when this execution recorded steps (Step), that it
// ends without completing and its steps stay with the key: the execution
// that takes the key over gets their results instead of running them
// again, and a retry with another request under the key is refused.
func (x *execution) warnStepsKept(reason string, cause error) {
	st := &x.st
	st.mu.Lock()
	saved := st.savedSteps
	names := make([]string, 0, len(st.recorded))
	for _, s := range st.recorded {
		names = append(names, s.Name)
	}
	st.mu.Unlock()
	if !saved {
		return
	}
	e := x.e
	e.config.Logger.WarnContext(x.ctx, "idem: the execution recorded steps and ends without completing; the steps are kept with the key, and a retry of the same request takes it over and gets their results instead of running them again",
		slog.String("reason", reason), slog.String("store", e.info.Name),
		tenantAttr(x.op.Tenant), slog.String("key", x.op.Key),
		slog.Any("steps", names), errorAttr(cause))
}

// rollback abandons the unit of work, and says so when the handler ran
// and its writes were undone for a reason other than its own choice.
func (x *execution) rollback(reason string, cause error) {
	_ = x.e.rollbackUnit(context.WithoutCancel(x.ctx), x.unit)
	if reason != "" {
		x.e.warnRolledBack(x.ctx, x.op, reason, cause)
	}
}

// keepInFlight leaves the key held, unextended, until its lease ends, for
// an execution on a store without transactions whose effects may stand.
func (x *execution) keepInFlight(reason string, cause error) {
	e := x.e
	e.config.Logger.WarnContext(x.ctx, "idem: the key stays in flight until its lease ends, since the handler's effects cannot be undone and a retry would repeat them",
		slog.String("reason", reason), slog.String("store", e.info.Name),
		tenantAttr(x.op.Tenant), slog.String("key", x.op.Key),
		slog.Duration("lease", e.config.Lease), errorAttr(cause))
	x.warnStepsKept(reason, cause)
}

// tookOver logs and traces a claim won over an execution whose lease had
// ended: it died, stalled, or was rolled back after recording steps.
func (e *Engine) tookOver(ctx context.Context, op Operation, claim *ClaimResult) {
	point := ""
	if n := len(claim.Steps); n > 0 {
		point = claim.Steps[n-1].Name
	}
	e.config.Logger.InfoContext(ctx, "idem: key taken over from an earlier execution whose lease ended",
		slog.String("store", e.info.Name), tenantAttr(op.Tenant), slog.String("key", op.Key),
		slog.String("recovery_point", point))
	e.traceLease(ctx, LeaseTakeover, nil)
}

// lostLease logs and traces an execution whose lease was taken over, found
// by the heartbeat or at the completion. On a transactional store
// warnRolledBack says it too, with what was undone.
func (e *Engine) lostLease(ctx context.Context, op Operation, foundBy string) {
	if !e.info.Transactional {
		e.config.Logger.WarnContext(ctx, "idem: lease lost to a takeover; the answer is discarded and the handler's effects stand",
			slog.String("found_by", foundBy), slog.String("store", e.info.Name),
			tenantAttr(op.Tenant), slog.String("key", op.Key))
	}
	e.traceLease(ctx, LeaseLost, nil)
}

// warnRolledBack logs that a handler ran and its work was rolled back.
func (e *Engine) warnRolledBack(ctx context.Context, op Operation, reason string, cause error) {
	if !e.info.Transactional {
		return
	}
	e.config.Logger.WarnContext(ctx, "idem: the handler ran and its writes were rolled back; effects it made outside the store's transaction stand",
		slog.String("reason", reason), slog.String("store", e.info.Name),
		tenantAttr(op.Tenant), slog.String("key", op.Key), errorAttr(cause))
}

func callHandler(ctx context.Context, fn func(ctx context.Context) (Result, error)) (res Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = &PanicError{Value: v, Stack: debug.Stack()}
		}
	}()
	return fn(ctx)
}
