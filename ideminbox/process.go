package ideminbox

import (
	"context"
	"errors"
	"time"

	"github.com/idem-go/idem"
)

// ErrNoMessageID means a message carries no id to deduplicate on. It is
// never processed without one: Process answers Reject, so that the adapter
// hands the message back to the broker without requeue (to its dead-letter
// exchange, for RabbitMQ) instead of running it unprotected.
var ErrNoMessageID = errors.New("ideminbox: the message has no id")

// Message is what the inbox needs of a delivered message. Adapters fill it
// from the broker's message.
type Message struct {
	// ID names the message: the publisher's message id, the same on every
	// copy and redelivery. It is the dedup key, with Tenant(consumer) as
	// tenant. An id that is not a valid idem key (longer than 255 bytes,
	// not visible ASCII) is replaced by its SHA-256, so it still dedups.
	ID string

	// Attempt is the broker's delivery number, from 1 (JetStream
	// NumDelivered, RabbitMQ x-delivery-count + 1): the same number each
	// time the same delivery is processed again after a Hold. Zero means
	// the broker does not say: the inbox then counts failures itself, in
	// memory, per process (see Config.LocalAttemptsLimit), which makes a
	// poison message take up to MaxAttempts deliveries per consumer
	// process, and a message that crashes its consumer loop forever.
	Attempt int

	// Subject is where the message came from (subject, queue); for logs
	// and dead-lettering only.
	Subject string

	// Data is the payload. It is stored with a poison record, up to
	// Config.MaxPoisonData bytes.
	Data []byte

	// Raw is the broker's own message (jetstream.Msg, amqp091.Delivery),
	// for a DeadLetterFunc that republishes it.
	Raw any
}

// Action is what to do with a delivery.
type Action uint8

const (
	// Ack: the handler ran and its effects committed.
	Ack Action = iota + 1
	// AckDuplicate: the message was processed (or recorded as poison)
	// before; acknowledge it without running anything.
	AckDuplicate
	// AckPoison: the message failed on its last allowed attempt; it is
	// recorded as poison, dead-lettered, and must be acknowledged so that
	// it is not redelivered forever.
	AckPoison
	// Nack: negatively acknowledge, asking for a redelivery after
	// Decision.Delay. Nothing of the handler's work was kept.
	Nack
	// Reject: the message cannot be processed safely (ErrNoMessageID);
	// give it back without requeue.
	Reject
	// Hold: settle nothing; keep the delivery and process it again, the
	// same delivery with the same Message.Attempt: once AwaitStore returns
	// when the error wraps idem.ErrStore (the store failed; the handler's
	// work, if it ran, was not kept), else after Decision.Delay (another
	// execution holds the key). A delivery held, rather than given back,
	// spends none of the broker's delivery count (JetStream MaxDeliver, a
	// quorum queue's delivery-limit): on JetStream, report it in progress
	// meanwhile. An adapter that cannot hold may nack instead; this
	// process then does not count that delivery as an attempt.
	Hold
)

// String returns the action's name, for logs.
func (a Action) String() string {
	switch a {
	case Ack:
		return "ack"
	case AckDuplicate:
		return "ack-duplicate"
	case AckPoison:
		return "ack-poison"
	case Nack:
		return "nack"
	case Reject:
		return "reject"
	case Hold:
		return "hold"
	}
	return "unknown"
}

// Actions returns every Action, in the order of their values: for a
// tracer that makes one series per action up front.
func Actions() []Action { return []Action{Ack, AckDuplicate, AckPoison, Nack, Reject, Hold} }

// Decision is the answer of Process: what the adapter must tell the broker.
type Decision struct {
	Action Action
	// Delay is the wait before the redelivery (Nack), or before processing
	// the delivery again (Hold, in flight).
	Delay time.Duration
}

// Acked reports whether the delivery is to be acknowledged.
func (d Decision) Acked() bool {
	return d.Action == Ack || d.Action == AckDuplicate || d.Action == AckPoison
}

// AwaitsStore reports whether the delivery is held until the store answers
// again (Hold with an error wrapping idem.ErrStore): err is the error
// Process returned with d.
func (d Decision) AwaitsStore(err error) bool {
	return d.Action == Hold && errors.Is(err, idem.ErrStore)
}

// Process runs handler at most once for msg, and returns what to tell the
// broker. Acknowledge only after Process returns: by then the handler's
// writes and the dedup record have committed together.
//
//   - First delivery, or redelivery of a message that failed: the handler
//     runs; on success Ack, on failure Nack with RetryDelayFunc's delay and
//     the handler's error, or on attempt MaxAttempts or later, the
//     poison path (AckPoison and the handler's error). A failure is an
//     error or a panic of the handler, or a success it answered after a
//     failed statement had aborted its transaction (idem.ErrWritesAborted:
//     its writes are lost, nothing is stored).
//   - Duplicate of a processed or poison message: AckDuplicate; nothing runs.
//   - Message in flight in another execution: Hold for InFlightDelay,
//     with idem.ErrInFlight.
//   - Store unreachable, before or after the handler ran, or while it ran
//     (errors.Is(err, idem.ErrStore)): Hold until AwaitStore returns; the
//     handler did not run, or its work was rolled back, and the delivery
//     is not counted as an attempt. If the store keeps failing on this
//     delivery although it answers AwaitStore (more than three times in a
//     row), Nack with RetryDelayFunc's delay instead, so that one message
//     the store refuses cannot hold its consumer forever; and when the
//     handler ran before each of those failures (the database ended its
//     transaction under it, or refused what it did), its failure counts
//     as an attempt, as any handler failure (Nack, or the poison path).
//   - The inbox closed (idem.ErrClosed): Nack without delay, not counted.
//   - ctx ended: Nack without delay; the delivery is not counted as an
//     attempt. On a store without transactions, a handler that returned
//     no error is completed all the same (see idem.Engine.Do): Ack.
//   - Past MaxAttempts, with the key still held by a claim nobody
//     answered: the message is granted a last run, which takes the key
//     over once that claim's lease has ended (Hold until then); past
//     MaxAttempts with the key held by another claim than the one the
//     last run was granted over (the last run did not answer either):
//     recorded as poison without running, with ErrUnanswered, once that
//     claim's lease has ended (Hold until then).
//   - No id: Reject with ErrNoMessageID.
//
// The error explains every answer other than Ack and AckDuplicate.
func (in *Inbox) Process(ctx context.Context, msg Message, handler HandlerFunc) (Decision, error) {
	if in.config.Tracer != nil {
		return in.processTraced(ctx, msg, handler)
	}
	return in.process(ctx, msg, handler)
}

func (in *Inbox) process(ctx context.Context, msg Message, handler HandlerFunc) (Decision, error) {
	if msg.ID == "" {
		return Decision{Action: Reject}, ErrNoMessageID
	}
	op := idem.Operation{Tenant: in.tenant, Key: Key(msg.ID)}
	attempt := in.local.attempt(op.Key, msg.Attempt)
	if msg.Attempt > 0 && attempt > in.config.MaxAttempts {
		if d, err, decided := in.unanswered(ctx, op, msg, attempt); decided {
			return d, err
		}
	}

	ran := false // whether the handler started, for a failure of the store after it
	out, err := in.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		ran = true
		if err := handler(ctx); err != nil {
			// Marked, so that a handler error is never mistaken for one of
			// the engine's (a handler may itself return idem.ErrInFlight).
			return idem.Result{}, &handlerError{err}
		}
		return processedResult(), nil
	})
	var herr *handlerError
	var perr *idem.PanicError
	switch {
	case err == nil && out.Replayed:
		in.local.forget(op.Key)
		return Decision{Action: AckDuplicate}, nil
	case err == nil, isProcessed(out.Result):
		// The second case: ctx ended while the handler ran, on a store
		// without transactions; its effects could not be undone, so the
		// engine completed its answer on a context of its own. It is
		// stored: a redelivery would only be acknowledged as a duplicate.
		in.local.forget(op.Key)
		return Decision{Action: Ack}, nil
	case ctx.Err() != nil:
		// Shutting down: not the message's fault, not counted as a failure.
		in.local.unrun(op.Key, msg.Attempt)
		if errors.As(err, &herr) {
			err = herr.err
		}
		return Decision{Action: Nack}, err
	case errors.As(err, &herr):
		err = herr.err
	case errors.As(err, &perr):
	case errors.Is(err, idem.ErrWritesAborted):
		// The handler answered a success after a failed statement had
		// aborted its transaction: its writes are lost, nothing was
		// stored and the key was released. Its failure, not the store's.
	case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrLeaseLost):
		// Another execution holds (or took over) the key: its outcome
		// decides. Come back once it has had the time to finish.
		in.local.unrun(op.Key, msg.Attempt)
		return Decision{Action: Hold, Delay: in.config.InFlightDelay}, err
	case errors.Is(err, idem.ErrClosed):
		in.local.unrun(op.Key, msg.Attempt)
		return Decision{Action: Nack}, err
	default:
		// The store failed, not the handler: never poison a message for it.
		return in.storeFailed(ctx, op, msg, attempt, err, ran)
	}

	// The handler failed (error, panic, or a success whose writes a failed
	// statement had aborted), and the engine rolled its writes back and
	// released the key. A handler whose store went down under it fails
	// too: check the store before counting the failure.
	if serr := in.checkStore(ctx); serr != nil {
		if errors.Is(serr, idem.ErrClosed) {
			in.local.unrun(op.Key, msg.Attempt)
			return Decision{Action: Nack}, errors.Join(err, serr)
		}
		return in.storeFailed(ctx, op, msg, attempt, errors.Join(err, serr), false)
	}
	return in.failed(ctx, op, msg, attempt, err)
}

// failed answers a delivery on which the handler ran and failed: it counts
// as an attempt. Nack for a redelivery, or, on attempt MaxAttempts or
// later, the poison path.
func (in *Inbox) failed(ctx context.Context, op idem.Operation, msg Message, attempt int, err error) (Decision, error) {
	in.local.ran(op.Key, msg.Attempt)
	if attempt < in.config.MaxAttempts {
		if msg.Attempt <= 0 {
			in.local.fail(op.Key)
		}
		return Decision{Action: Nack, Delay: in.config.RetryDelayFunc(attempt)}, err
	}
	return in.poison(ctx, op, msg, attempt, err, Nack)
}

// storeFailures is how many store failures in a row one delivery may meet
// while the store answers AwaitStore, before it is given back.
const storeFailures = 3

// storeFailed answers a delivery whose store operations failed: Hold until
// the store answers, and count nothing. Unless the store keeps refusing
// this very delivery while it answers every check: then the delivery is
// given back (Nack), so that one message cannot hold its consumer
// forever; and if the handler ran each time, and each time the store
// refused what it did (its transaction ended by the database under it, a
// completion refused), the failure is the handler's and counts as an
// attempt, so that such a message ends as poison instead of running
// forever.
func (in *Inbox) storeFailed(ctx context.Context, op idem.Operation, msg Message, attempt int, err error, ran bool) (Decision, error) {
	n, allRan := in.local.storeFailure(op.Key, msg.Attempt, in.storeEpoch.Load(), ran)
	if n <= storeFailures {
		in.local.unrun(op.Key, msg.Attempt)
		return Decision{Action: Hold}, err
	}
	if allRan {
		return in.failed(ctx, op, msg, attempt, err)
	}
	in.local.unrun(op.Key, msg.Attempt)
	return Decision{Action: Nack, Delay: in.config.RetryDelayFunc(attempt)}, err
}

// handlerError marks an error returned by the handler.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }
