package ideminbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
)

// Defaults for Config.
const (
	DefaultMaxAttempts   = 5
	DefaultInFlightDelay = 5 * time.Second
	DefaultRetention     = 7 * 24 * time.Hour
)

// ErrNoMessageID means a message carries no id to deduplicate on. It is
// never processed without one: Process answers Reject, so that the adapter
// hands the message back to the broker without requeue (to its dead-letter
// exchange, for RabbitMQ) instead of running it unprotected.
var ErrNoMessageID = errors.New("ideminbox: the message has no id")

// HandlerFunc does the work of one message. ctx carries the store's
// transaction (idemsql.TxFromContext(ctx), idempg.Tx(ctx)): writes made through it
// commit together with the dedup record, or not at all. Returning an error
// rolls them back and releases the key, so the redelivery runs again.
type HandlerFunc func(ctx context.Context) error

// DeadLetterFunc receives a poison message and the error of its last
// attempt. It runs inside the transaction that records the message as
// poison: a dead-letter row written through ctx (idemsql.TxFromContext(ctx), …)
// commits with that record, exactly once. Something sent elsewhere (a
// publish to a dead-letter queue) is at least once: if the commit fails
// after it, the message comes back and is dead-lettered again. An error
// rolls back, and the message is negatively acknowledged and redelivered.
type DeadLetterFunc func(ctx context.Context, msg Message, cause error) error

// Config configures an Inbox. The zero value of every field but Consumer
// and one of Engine or Store means its documented default.
type Config struct {
	// Engine supplies the store and the lease settings (Lease, Heartbeat,
	// CleanupTimeout, Logger). The inbox runs its own engine over the same
	// store with Retention below in place of the engine's, because
	// consumer keys must outlive broker redelivery windows, which are far
	// longer than an HTTP client's retries. Set Engine or Store, not both.
	Engine *idem.Engine

	// Store keeps the dedup records when Engine is nil; the inbox then runs
	// an engine with the default lease settings.
	Store idem.Store

	// Consumer names the consumer. It is the tenant of every key, so two
	// consumers of one message (two services reading one stream) each
	// process it once, independently. Required.
	Consumer string

	// MaxAttempts is the delivery number from which a failing message is
	// poison: when the handler fails on delivery MaxAttempts or later, the
	// message is recorded as poison, handed to DeadLetterFunc and
	// acknowledged. Deliveries are counted by the broker (see
	// Message.Attempt), so deliveries answered "in flight" and deliveries
	// lost to a crashed consumer count too: a message that kills its
	// consumer every time must end as poison as well. Defaults to 5.
	MaxAttempts int

	// DeadLetterFunc receives poison messages. Defaults to none: the
	// message is still recorded as poison in the store, with its payload
	// and error (see Inbox.Status), so it is never lost.
	DeadLetterFunc DeadLetterFunc

	// InFlightDelay is how long to wait before the redelivery of a message
	// that another consumer instance is processing right now. Defaults to
	// 5s. Shorter makes a concurrent duplicate settle sooner; longer keeps
	// a message whose holder crashed from using up its deliveries before
	// the lease ends and the key can be taken over.
	InFlightDelay time.Duration

	// RetryDelayFunc gives the delay before the redelivery of a message
	// whose handler failed on delivery attempt. Defaults to 1s doubled at
	// each attempt, capped at 1m.
	RetryDelayFunc func(attempt int) time.Duration

	// Retention is how long a processed message's key is kept, so that a
	// duplicate arriving within it is acknowledged without running. It
	// must exceed the longest delay after which the broker or a publisher
	// may send the message again. Records are purged like HTTP keys, by
	// idem.Janitor. Defaults to 7 days.
	Retention time.Duration

	// LocalAttemptsLimit bounds the failure counts kept in memory for
	// messages whose broker reports no delivery number (Attempt 0).
	// Defaults to 10000; past it the oldest counts are forgotten.
	LocalAttemptsLimit int

	// Logger is the engine's logger when the inbox builds its engine from
	// Store, and the adapters' default. Defaults to the engine's logger.
	Logger *slog.Logger
}

// Inbox processes each message at most once per consumer, with the
// message id as key: claim, run the handler in the store's transaction,
// commit the dedup record in that same transaction. It answers what to do
// with the delivery (a Decision); the acknowledgement must be sent only
// after Process returns, which is after the commit.
//
// An Inbox is safe for concurrent use.
type Inbox struct {
	engine *idem.Engine
	config Config
	local  *localAttempts
}

// New returns an inbox.
func New(config Config) (*Inbox, error) {
	if config.Consumer == "" {
		return nil, errors.New("ideminbox: Config.Consumer is required")
	}
	if (config.Engine == nil) == (config.Store == nil) {
		return nil, errors.New("ideminbox: set exactly one of Config.Engine and Config.Store")
	}
	if config.Retention <= 0 {
		config.Retention = DefaultRetention
	}
	var ec idem.Config
	if config.Engine != nil {
		ec = config.Engine.Config()
		config.Store = config.Engine.Store()
	}
	ec.Retention = config.Retention
	if config.Engine == nil && config.Logger != nil {
		ec.Logger = config.Logger
	}
	engine, err := idem.NewEngine(config.Store, &ec)
	if err != nil {
		return nil, err
	}
	config.Engine = engine
	if config.MaxAttempts <= 0 {
		config.MaxAttempts = DefaultMaxAttempts
	}
	if config.InFlightDelay <= 0 {
		config.InFlightDelay = DefaultInFlightDelay
	}
	if config.RetryDelayFunc == nil {
		config.RetryDelayFunc = defaultRetryDelay
	}
	if config.LocalAttemptsLimit <= 0 {
		config.LocalAttemptsLimit = 10000
	}
	if config.Logger == nil {
		config.Logger = engine.Config().Logger
	}
	return &Inbox{engine: engine, config: config, local: newLocalAttempts(config.LocalAttemptsLimit)}, nil
}

func defaultRetryDelay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 7 {
		return time.Minute
	}
	return min(time.Second<<(attempt-1), time.Minute)
}

// Config returns the inbox's configuration with defaults filled in; its
// Engine is the inbox's own.
func (in *Inbox) Config() Config { return in.config }

// InFlightDeliveries is how many deliveries of one message the inbox may
// answer "in flight" before its key can be taken over: a holder that
// crashed keeps the key for its whole lease, and each answer asks for the
// message again after InFlightDelay. These deliveries count (see
// MaxAttempts), so a broker that stops delivering after a fixed count
// (JetStream's MaxDeliver, a quorum queue's delivery-limit) must allow
// more than this as well as more than MaxAttempts, or it may drop a
// message that never ran. With the defaults (a 90s lease, 5s) it is 19.
func (in *Inbox) InFlightDeliveries() int {
	lease, delay := in.engine.Config().Lease, in.config.InFlightDelay
	return int((lease+delay-1)/delay) + 1
}

// Message is what the inbox needs of a delivered message. Adapters fill it
// from the broker's message.
type Message struct {
	// ID names the message: the publisher's message id, the same on every
	// copy and redelivery. It is the dedup key, with the consumer name as
	// tenant. An id that is not a valid idem key (longer than 255 bytes,
	// not visible ASCII) is replaced by its SHA-256, so it still dedups.
	ID string

	// Attempt is the broker's delivery number, from 1 (JetStream
	// NumDelivered, RabbitMQ x-delivery-count + 1). Zero means the broker
	// does not say: the inbox then counts failures itself, in memory, per
	// process (see Config.LocalAttemptsLimit), which makes a poison message
	// take up to MaxAttempts deliveries per consumer process.
	Attempt int

	// Subject is where the message came from (subject, queue); for logs
	// and dead-lettering only.
	Subject string

	// Data is the payload. It is stored with a poison record.
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
	}
	return "unknown"
}

// Decision is the answer of Process: what the adapter must tell the broker.
type Decision struct {
	Action Action
	// Delay is the wait before the redelivery (Nack only).
	Delay time.Duration
}

// Acked reports whether the delivery is to be acknowledged.
func (d Decision) Acked() bool {
	return d.Action == Ack || d.Action == AckDuplicate || d.Action == AckPoison
}

// Process runs handler at most once for msg, and returns what to tell the
// broker. Acknowledge only after Process returns: by then the handler's
// writes and the dedup record have committed together.
//
//   - First delivery, or redelivery of a message that failed: the handler
//     runs; on success Ack, on failure Nack with RetryDelayFunc's delay and
//     the handler's error, or on delivery MaxAttempts or later, the
//     poison path (AckPoison and the handler's error).
//   - Duplicate of a processed or poison message: AckDuplicate; nothing runs.
//   - Message in flight in another instance: Nack after InFlightDelay,
//     with idem.ErrInFlight.
//   - Store unreachable (errors.Is(err, idem.ErrStore)): Nack; the handler
//     did not run or was rolled back.
//   - ctx ended: Nack without delay; the attempt is not counted as a
//     failure.
//   - No id: Reject with ErrNoMessageID.
//
// The error explains every answer other than Ack and AckDuplicate.
func (in *Inbox) Process(ctx context.Context, msg Message, handler HandlerFunc) (Decision, error) {
	if msg.ID == "" {
		return Decision{Action: Reject}, ErrNoMessageID
	}
	op := idem.Operation{Tenant: in.config.Consumer, Key: Key(msg.ID)}
	attempt := msg.Attempt
	if attempt <= 0 {
		attempt = in.local.failures(op.Key) + 1
	}

	out, err := in.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := handler(ctx); err != nil {
			// Marked, so that a handler error is never mistaken for one of
			// the engine's (a handler may itself return idem.ErrInFlight).
			return idem.Result{}, &handlerError{err}
		}
		return idem.Result{Mode: idem.ModeMarker, Status: statusProcessed}, nil
	})
	var herr *handlerError
	var perr *idem.PanicError
	switch {
	case err == nil && out.Replayed:
		in.local.forget(op.Key)
		return Decision{Action: AckDuplicate}, nil
	case err == nil:
		in.local.forget(op.Key)
		return Decision{Action: Ack}, nil
	case ctx.Err() != nil:
		// Shutting down: not the message's fault, not counted as a failure.
		if errors.As(err, &herr) {
			err = herr.err
		}
		return Decision{Action: Nack}, err
	case errors.As(err, &herr):
		err = herr.err
	case errors.As(err, &perr):
	case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrLeaseLost):
		// Another instance holds (or took over) the key: its outcome
		// decides. Come back once it has had the time to finish.
		return Decision{Action: Nack, Delay: in.config.InFlightDelay}, err
	default:
		// The store failed, not the handler: never poison a message for it.
		return Decision{Action: Nack, Delay: in.config.RetryDelayFunc(attempt)}, err
	}

	// The handler failed (error or panic), and the engine rolled its writes
	// back and released the key.
	if attempt < in.config.MaxAttempts {
		if msg.Attempt <= 0 {
			in.local.fail(op.Key)
		}
		return Decision{Action: Nack, Delay: in.config.RetryDelayFunc(attempt)}, err
	}
	return in.poison(ctx, op, msg, attempt, err)
}

// poison records msg as complete with a poison marker, in a claim of its
// own (the handler's was released with its rollback), and calls the
// dead-letter hook in that transaction.
func (in *Inbox) poison(ctx context.Context, op idem.Operation, msg Message, attempt int, cause error) (Decision, error) {
	out, err := in.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if in.config.DeadLetterFunc != nil {
			if err := in.config.DeadLetterFunc(ctx, msg, cause); err != nil {
				return idem.Result{}, fmt.Errorf("ideminbox: dead-letter hook: %w", err)
			}
		}
		return idem.Result{
			Mode:   idem.ModeResponse,
			Status: statusPoison,
			Header: map[string][]string{
				headerError:   {fieldtext.Escape(cause.Error())},
				headerAttempt: {strconv.Itoa(attempt)},
				headerSubject: {fieldtext.Escape(msg.Subject)},
			},
			Body: msg.Data,
		}, nil
	})
	switch {
	case err == nil && out.Replayed:
		// Between the release and this claim, a redelivery elsewhere
		// completed the message (maybe successfully): nothing to record.
		in.local.forget(op.Key)
		return Decision{Action: AckDuplicate}, nil
	case err == nil:
		in.local.forget(op.Key)
		return Decision{Action: AckPoison}, cause
	case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrLeaseLost):
		return Decision{Action: Nack, Delay: in.config.InFlightDelay}, err
	case ctx.Err() != nil:
		return Decision{Action: Nack}, err
	}
	// The record could not be written or the hook failed: keep the message
	// (it will run again, and be poison again if it fails again).
	return Decision{Action: Nack, Delay: in.config.RetryDelayFunc(attempt)}, errors.Join(cause, err)
}

// handlerError marks an error returned by the handler.
type handlerError struct{ err error }

func (e *handlerError) Error() string { return e.err.Error() }
func (e *handlerError) Unwrap() error { return e.err }

// Key returns the dedup key of a message id: the id itself when it is a
// valid idem key, otherwise "sha256:" and the hex SHA-256 of the id. Ids
// that themselves start with "sha256:" are hashed too, so a hashed key
// never collides with a plain one.
func Key(id string) string {
	if idem.ValidateKey(id) == nil && !strings.HasPrefix(id, hashedPrefix) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return hashedPrefix + hex.EncodeToString(sum[:])
}

const hashedPrefix = "sha256:"

// Status codes stored in idem.Result.Status for consumer records.
const (
	statusProcessed = 200
	statusPoison    = 599
)

// Header names of a poison record's idem.Result.Header.
const (
	headerError   = "Ideminbox-Error"
	headerAttempt = "Ideminbox-Attempt"
	headerSubject = "Ideminbox-Subject"
)
