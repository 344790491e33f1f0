package ideminbox

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
	"github.com/idem-go/idem/internal/tracers"
)

// ErrUnanswered is the recorded cause of a message given up without
// running again: it came back more than MaxAttempts times, was granted
// one last run, and the consumer that took that last run stopped
// (crashed, was killed) while handling it, as had the one before it: as
// a message that kills its consumer does every time.
var ErrUnanswered = errors.New("ideminbox: delivered more than MaxAttempts times, and its last run, like the run before it, stopped before answering (the message may crash its consumer)")

// unanswered decides a delivery past MaxAttempts. Every earlier failure
// would have made the message poison by now, so some earlier deliveries
// were never answered: given back before they ran (the key is then free;
// the message runs once more), or taken by an execution that never
// answered (the key is then still held by its claim). That execution may
// have crashed on the message, or it may have run the handler to the end
// and met the store down when it came to store the outcome, then stopped
// before the store came back: the store cannot tell the two apart, and a
// store failure must never make a message poison. So the first time a
// delivery past MaxAttempts finds the key held, the message is granted a
// last run: the claim found holding the key is recorded (lastRun), and
// the message runs once more, taking the key over when that claim's lease
// ends. A delivery that then finds the key held by another claim, the
// last run's own or a later one, knows that the last run never answered
// either: the message is recorded as poison without running again.
func (in *Inbox) unanswered(ctx context.Context, op idem.Operation, msg Message, attempt int) (Decision, error, bool) {
	var rec *idem.Record
	err := tracers.Store(ctx, in.engine.Config().Tracer, idem.StoreGet, in.store.Info().Name, func(ctx context.Context) (err error) {
		rec, err = in.store.Get(ctx, op.Tenant, op.Key)
		return err
	})
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return Decision{}, nil, false
	case err != nil:
		if ctx.Err() != nil {
			in.local.unrun(op.Key, msg.Attempt)
			return Decision{Action: Nack}, err, true
		}
		d, err := in.storeFailed(ctx, op, msg, attempt, &idem.StoreError{Op: "get", Err: err}, false)
		return d, err, true
	case rec.State != idem.StateInFlight:
		return Decision{}, nil, false
	}
	granted, err := in.lastRun(ctx, op, rec.LeaseToken)
	switch {
	case err == nil && granted == rec.LeaseToken:
		// The key is still held by the claim the last run was granted
		// over: run (once its lease ends).
		return Decision{}, nil, false
	case err == nil:
		d, err := in.poison(ctx, op, msg, attempt, ErrUnanswered, Hold)
		return d, err, true
	case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrLeaseLost):
		// Another delivery of the message records the grant right now.
		in.local.unrun(op.Key, msg.Attempt)
		return Decision{Action: Hold, Delay: in.config.InFlightDelay}, err, true
	case ctx.Err() != nil, errors.Is(err, idem.ErrClosed):
		in.local.unrun(op.Key, msg.Attempt)
		return Decision{Action: Nack}, err, true
	}
	d, err := in.storeFailed(ctx, op, msg, attempt, err, false)
	return d, err, true
}

// lastRun returns the lease token of the claim that held the key of op
// when the message was granted its last run (see unanswered), recording
// holder as that claim if no grant was recorded yet. The grant is a record
// of its own, under the inbox's tenant and a key derived from op's
// (lastRunKey), kept for Retention like the message's.
func (in *Inbox) lastRun(ctx context.Context, op idem.Operation, holder int64) (int64, error) {
	out, err := in.engine.Do(ctx, idem.Operation{Tenant: in.tenant, Key: lastRunKey(op.Key)}, func(ctx context.Context) (idem.Result, error) {
		return lastRunResult(holder), nil
	})
	if err != nil {
		return 0, err
	}
	granted, derr := decodeLastRun(out.Result)
	if derr != nil {
		return 0, recordError(lastRunKey(op.Key), out.Result)
	}
	return granted, nil
}

// poison records msg as complete with a poison marker, in a claim of its
// own (the handler's was released with its rollback), and calls the
// dead-letter hook in that transaction. inFlight is the answer when the
// key is held by another execution.
func (in *Inbox) poison(ctx context.Context, op idem.Operation, msg Message, attempt int, cause error, inFlight Action) (Decision, error) {
	data := msg.Data
	if len(data) > in.config.MaxPoisonData {
		data = data[:in.config.MaxPoisonData]
	}
	out, err := in.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if in.config.DeadLetterFunc != nil {
			if err := in.config.DeadLetterFunc(ctx, msg, cause); err != nil {
				return idem.Result{}, fmt.Errorf("ideminbox: dead-letter hook: %w", err)
			}
		}
		return poisonResult(poisonRecord{
			Attempt:  attempt,
			Error:    fieldText(cause.Error()),
			Subject:  fieldText(msg.Subject),
			DataSize: len(msg.Data),
		}, data), nil
	})
	switch {
	case err == nil && out.Replayed:
		// Between the release and this claim, a redelivery elsewhere
		// completed the message (maybe successfully): nothing to record.
		in.local.forget(op.Key)
		return Decision{Action: AckDuplicate}, nil
	case err == nil, isPoison(out.Result):
		// The second case: ctx ended while the hook ran, on a store
		// without transactions, and the engine stored the record all the
		// same (see Process).
		in.local.forget(op.Key)
		return Decision{Action: AckPoison}, cause
	case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrLeaseLost):
		// After a handler failure, the key is held when the handler
		// panicked on a store without transactions (kept until its lease
		// ends), or by a redelivery elsewhere: give the delivery back, and
		// the next one, past MaxAttempts, is recorded once the key is
		// free. Past MaxAttempts already, wait here for the lease to end.
		return Decision{Action: inFlight, Delay: in.config.InFlightDelay}, err
	case ctx.Err() != nil:
		return Decision{Action: Nack}, err
	case errors.Is(err, idem.ErrStore):
		return in.storeFailed(ctx, op, msg, attempt, errors.Join(cause, err), false)
	}
	// The hook failed: keep the message (it will run again, and be poison
	// again if it fails again).
	return Decision{Action: Nack, Delay: in.config.RetryDelayFunc(attempt)}, errors.Join(cause, err)
}

// maxFieldText bounds the error and subject kept in a poison record.
const maxFieldText = 4096

// fieldText returns s fit for a poison record, and for an operator's
// screen: control characters
// escaped, and cut to maxFieldText bytes (on a character boundary).
func fieldText(s string) string {
	s = fieldtext.Escape(s)
	if len(s) <= maxFieldText {
		return s
	}
	const mark = "…(truncated)"
	cut := maxFieldText - len(mark)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + mark
}
