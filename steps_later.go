package idem

import (
	"context"
	"errors"
	"log/slog"
	"time"
)

// A step that ran and whose record failed (the store was unreachable, or
// busy for longer than it lets a write wait) leaves an effect that stands
// with no record of it. Keeping the key in flight until its lease ends
// only delays the takeover, which would then run the step again. Instead,
// while the heartbeat still holds the lease, the engine goes on trying to
// record the step after the handler has returned, keeping the lease
// extended meanwhile: a retry of the request is told the key is in flight
// until the record is there, and the takeover that follows gets the step's
// result instead of running it again. Only a store unreachable for the
// whole lease (the heartbeat cannot extend it either), a store refusing
// the record for a whole lease, a lost lease or the engine's Close end
// the tries without the record: the key is then left to its lease, and
// the downstream key (DownstreamKey) is what keeps a second run harmless.

// saveLaterPause bounds the pause between two tries of a late record.
const saveLaterPause = time.Second

// savesLater reports whether the execution, whose handler has returned,
// ends with steps to record later, and if so starts recording them: its
// unit of work is rolled back and its lease stays with the heartbeat
// until saveLater is done.
func (x *execution) savesLater() bool {
	st := &x.st
	if !x.held || st.unsavedStep.Load() == nil || x.stepLostLease() != nil || st.lost.Load() || st.unrecordable.Load() {
		return false
	}
	st.mu.Lock()
	pending := st.pending
	st.pending = nil
	st.mu.Unlock()
	if len(pending) == 0 || !x.e.enter() {
		return false
	}
	x.cancel(nil)
	cause := *st.unsavedStep.Load()
	x.rollback("a step ran but was not recorded", cause)
	e := x.e
	e.config.Logger.WarnContext(x.ctx, "idem: a step ran but was not recorded; the answer is discarded, and the engine keeps the key in flight, its lease extended, while it tries again to record the step",
		slog.String("store", e.info.Name), slog.String("tenant", x.op.Tenant), slog.String("key", x.op.Key),
		slog.Int("steps", len(pending)), slog.Any("error", cause))
	go x.saveLater(pending, cause)
	return true
}

// saveLater records pending, the steps of the execution that ran and
// were not recorded, trying again until it succeeds, the lease is lost or
// the engine closes. Then it lets the lease go: released to the retry
// (which takes the key over and gets the steps) on a transactional store;
// left to end on another, where the handler's other effects may stand.
func (x *execution) saveLater(pending []RecordedStep, cause error) {
	e, st := x.e, &x.st
	defer e.exit()
	ctx := context.WithoutCancel(x.ctx)
	pause := 10 * time.Millisecond
	// As long as the key would have been held without the tries: a store
	// that refuses the record for good (a value over its packet limit)
	// must not keep the key for ever.
	deadline := time.Now().Add(e.config.Lease)
	for len(pending) > 0 {
		if st.lost.Load() || e.closed.Load() || time.Now().After(deadline) {
			break
		}
		sctx, cancel := context.WithTimeout(ctx, e.config.CleanupTimeout)
		err := st.saveStep(sctx, SaveStepParams{
			Tenant: st.info.Tenant, Key: st.info.Key, Token: st.info.LeaseToken,
			Name: pending[0].Name, Value: pending[0].Value,
		})
		cancel()
		if err == nil {
			pending = pending[1:]
			continue
		}
		if errors.Is(err, ErrLeaseLost) {
			st.lost.Store(true)
			break
		}
		time.Sleep(pause)
		pause = min(2*pause, saveLaterPause)
	}
	lost := x.stopLease() || st.lost.Load()
	switch {
	case lost:
		e.lostLease(ctx, x.op, "step")
	case len(pending) > 0:
		// The store refused for a whole lease, or the engine closed:
		// the lease ends unextended from here.
		x.keepInFlight("a step ran but was not recorded", cause)
	default:
		e.config.Logger.InfoContext(ctx, "idem: a step that ran was recorded after the handler returned; its key goes to the retry, which gets the step's result",
			slog.String("store", e.info.Name), slog.String("tenant", x.op.Tenant), slog.String("key", x.op.Key))
		if e.info.Transactional {
			e.release(ctx, x.op, x.token)
		}
	}
}
