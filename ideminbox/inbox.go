package ideminbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
)

// Defaults for Config.
const (
	DefaultMaxAttempts        = 5
	DefaultInFlightDelay      = 5 * time.Second
	DefaultRetention          = 7 * 24 * time.Hour
	DefaultStoreRetryInterval = time.Second
	DefaultMaxPoisonData      = 1 << 20
)

// ErrNoMessageID means a message carries no id to deduplicate on. It is
// never processed without one: Process answers Reject, so that the adapter
// hands the message back to the broker without requeue (to its dead-letter
// exchange, for RabbitMQ) instead of running it unprotected.
var ErrNoMessageID = errors.New("ideminbox: the message has no id")

// ErrUnanswered is the recorded cause of a message given up without
// running again: it came back more than MaxAttempts times, was granted
// one last run, and the consumer that took that last run stopped
// (crashed, was killed) while handling it, as had the one before it: as
// a message that kills its consumer does every time.
var ErrUnanswered = errors.New("ideminbox: delivered more than MaxAttempts times, and its last run, like the run before it, stopped before answering (the message may crash its consumer)")

// HandlerFunc does the work of one message. ctx carries the store's
// transaction (idemsql.TxFromContext(ctx), idempg.TxFromContext(ctx)): writes made through it
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
	// longer than an HTTP client's retries. HTTP keys and consumer keys
	// may share the store: their tenants never meet (see Tenant). Set
	// Engine or Store, not both.
	Engine *idem.Engine

	// Store keeps the dedup records when Engine is nil; the inbox then runs
	// an engine with the default lease settings.
	Store idem.Store

	// Consumer names the consumer; Tenant(Consumer) is the tenant of every
	// key, so two consumers of one message (two services reading one
	// stream) each process it once, independently. Required: printable
	// UTF-8 text (no control character, tab and NUL included) of at most
	// 255 bytes.
	Consumer string

	// MaxAttempts is the number of handler attempts after which a failing
	// message is poison: when the handler fails on attempt MaxAttempts or
	// later, the message is recorded as poison, handed to DeadLetterFunc
	// and acknowledged. Attempts are the broker's delivery numbers (see
	// Message.Attempt) less the deliveries this process knows ended
	// without the handler failing (the store down, the message in flight
	// elsewhere, a shutdown), so that a store outage never makes a message
	// poison; the adapters hold such deliveries rather than give them
	// back, which keeps the broker's count as it was. A delivery the
	// consumer never answered (it crashed on it) counts, so that a message
	// that kills its consumer every time ends as poison too: the first
	// delivery past MaxAttempts that finds the key still held by a claim
	// nobody answered grants the message one last run (the claim may be
	// one whose handler succeeded and whose consumer stopped while the
	// store was down, which must not count); if that last run does not
	// answer either, the next delivery records the message as poison
	// without running it again (ErrUnanswered). Such a message takes
	// MaxAttempts+2 deliveries. Defaults to 5.
	MaxAttempts int

	// DeadLetterFunc receives poison messages. Defaults to none: the
	// message is still recorded as poison in the store, with its payload
	// and error (see Inbox.Status), so it is never lost.
	DeadLetterFunc DeadLetterFunc

	// InFlightDelay is how long a delivery is held before it is processed
	// again when another execution holds its key: a copy delivered while
	// another instance processes the message, or a message whose last
	// holder crashed and whose lease has not ended yet. Defaults to 5s.
	InFlightDelay time.Duration

	// RetryDelayFunc gives the delay before the redelivery of a message
	// whose handler failed on attempt. Defaults to 1s doubled at each
	// attempt, capped at 1m.
	RetryDelayFunc func(attempt int) time.Duration

	// StoreRetryInterval is how often AwaitStore tries the store while it
	// is unreachable. Defaults to 1s.
	StoreRetryInterval time.Duration

	// MaxPoisonData bounds the bytes of a poison message's payload kept in
	// its record, so that the record always fits the store (MariaDB
	// refuses a statement larger than its max_allowed_packet, 16 MiB by
	// default; a record that cannot be written would make the message come
	// back forever). Status.DataSize tells the whole payload's length;
	// DeadLetterFunc receives all of it. Defaults to 1 MiB; if you raise
	// it, keep it well under the store's largest statement.
	MaxPoisonData int

	// Retention is how long a processed message's key is kept, so that a
	// duplicate arriving within it is acknowledged without running. It
	// must exceed the longest delay after which the broker or a publisher
	// may send the message again. Records are purged like HTTP keys, by
	// idem.Janitor. Defaults to 7 days.
	Retention time.Duration

	// LocalAttemptsLimit bounds the messages whose deliveries this
	// process remembers (see MaxAttempts, and Message.Attempt for brokers
	// that keep no count). Defaults to 10000; past it the oldest are
	// forgotten.
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
	tenant string
	local  *localAttempts
	// storeEpoch counts the store checks that failed: a delivery's store
	// failures are counted in a row only while it does not move.
	storeEpoch atomic.Uint64
}

// maxConsumer bounds Config.Consumer: with the tenant's prefix it must fit
// every store (MySQL keeps tenants of up to 512 bytes).
const maxConsumer = 255

// NewInbox returns an inbox, or an error when config is unusable: no
// Consumer, a Consumer that is not printable text (see Config.Consumer),
// or not exactly one of Engine and Store.
func NewInbox(config *Config) (*Inbox, error) {
	if config == nil {
		return nil, errors.New("ideminbox: NewInbox needs a Config with its Consumer and its Engine or Store")
	}
	cfgCopy := *config
	config = &cfgCopy
	if config.Consumer == "" {
		return nil, errors.New("ideminbox: Config.Consumer is required")
	}
	if err := validateConsumer(config.Consumer); err != nil {
		return nil, err
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
	if config.StoreRetryInterval <= 0 {
		config.StoreRetryInterval = DefaultStoreRetryInterval
	}
	if config.MaxPoisonData <= 0 {
		config.MaxPoisonData = DefaultMaxPoisonData
	}
	if config.LocalAttemptsLimit <= 0 {
		config.LocalAttemptsLimit = 10000
	}
	if config.Logger == nil {
		config.Logger = engine.Config().Logger
	}
	return &Inbox{
		engine: engine,
		config: *config,
		tenant: Tenant(config.Consumer),
		local:  newLocalAttempts(config.LocalAttemptsLimit),
	}, nil
}

// validateConsumer refuses a consumer name that cannot be a tenant on
// every store: longer than maxConsumer, not UTF-8 (PostgreSQL refuses
// such text, so every claim would fail, the store checks with them, and
// the consumer would wait for a store that never answers), or holding a
// control character (NUL is refused by PostgreSQL too; the others would
// reach logs and operators' screens through the tenant).
func validateConsumer(name string) error {
	if len(name) > maxConsumer {
		return fmt.Errorf("ideminbox: Config.Consumer is %d bytes long, more than %d", len(name), maxConsumer)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("ideminbox: Config.Consumer %+q is not valid UTF-8; name the consumer with printable text", name)
	}
	for i, r := range name {
		if r == '\t' || fieldtext.IsCTL(r) {
			return fmt.Errorf("ideminbox: Config.Consumer %+q holds the control character %U at byte %d; name the consumer with printable text", name, r, i)
		}
	}
	return nil
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

// Tenant returns the tenant under which the inbox of consumer keeps its
// records: U+001F (the ASCII unit separator), "inbox:", then the consumer
// name. HTTP keys and consumer keys may share an engine and a store; the
// leading control character, which idemhttp refuses in the tenants its
// TenantFunc returns, keeps the two apart whatever names either side
// chooses: a request can never claim, replay or block a message's key,
// nor a message a request's.
func Tenant(consumer string) string { return tenantPrefix + consumer }

const tenantPrefix = "\x1finbox:"

// Config returns the inbox's configuration with defaults filled in; its
// Engine is the inbox's own.
func (in *Inbox) Config() Config { return in.config }

// GivenBackMargin is the room MinDeliveryLimit leaves for deliveries given
// back to the broker without running: each time a consumer stops, crashes
// or misses the broker's acknowledgement deadline while it holds a message
// (during a store outage, say), the broker counts one more delivery of it,
// which the inbox cannot take off once that consumer is gone.
const GivenBackMargin = 10

// MinDeliveryLimit returns the smallest finite delivery limit of the
// broker (JetStream's MaxDeliver, a RabbitMQ quorum queue's
// x-delivery-limit) under which the inbox, not the broker, decides what
// becomes of every message: MaxAttempts deliveries, two more to end a
// crash loop (the last run, and the delivery that records the message as
// poison), and GivenBackMargin. Past a lower limit the broker drops (or
// dead-letters) a message the inbox has neither processed nor recorded as
// poison. An unlimited one (-1) leaves nothing to chance, and is the
// advice: the inbox records every poison message itself.
func (in *Inbox) MinDeliveryLimit() int {
	return in.config.MaxAttempts + 2 + GivenBackMargin
}

// Close closes the inbox's engine (see idem.Engine.Close). Call it once
// the consumers using the inbox have returned.
func (in *Inbox) Close(ctx context.Context) error { return in.engine.Close(ctx) }

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
		return idem.Result{Mode: idem.ModeMarker, Status: statusProcessed}, nil
	})
	var herr *handlerError
	var perr *idem.PanicError
	switch {
	case err == nil && out.Replayed:
		in.local.forget(op.Key)
		return Decision{Action: AckDuplicate}, nil
	case err == nil, out.Result.Status == statusProcessed:
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
	rec, err := in.config.Store.Get(ctx, op.Tenant, op.Key)
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
		return idem.Result{Mode: idem.ModeResponse, Status: statusLastRun, Body: strconv.AppendInt(nil, holder, 10)}, nil
	})
	if err != nil {
		return 0, err
	}
	granted, perr := strconv.ParseInt(string(out.Result.Body), 10, 64)
	if perr != nil || out.Result.Status != statusLastRun {
		return 0, &idem.StoreError{Op: "get", Err: fmt.Errorf("ideminbox: the last-run record of key %q holds %q, not a lease token", op.Key, out.Result.Body)}
	}
	return granted, nil
}

// lastRunKey returns the key of the record of a message's last run:
// "sha256:last-run:" and the hex SHA-256 of the message's key. Key never
// returns it (it hashes every id that starts with "sha256:" into 64 hex
// digits right after the prefix), so no message id can claim it.
func lastRunKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hashedPrefix + "last-run:" + hex.EncodeToString(sum[:])
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
		return idem.Result{
			Mode:   idem.ModeResponse,
			Status: statusPoison,
			Header: map[string][]string{
				headerError:    {fieldText(cause.Error())},
				headerAttempt:  {strconv.Itoa(attempt)},
				headerSubject:  {fieldText(msg.Subject)},
				headerDataSize: {strconv.Itoa(len(msg.Data))},
			},
			Body: data,
		}, nil
	})
	switch {
	case err == nil && out.Replayed:
		// Between the release and this claim, a redelivery elsewhere
		// completed the message (maybe successfully): nothing to record.
		in.local.forget(op.Key)
		return Decision{Action: AckDuplicate}, nil
	case err == nil, out.Result.Status == statusPoison:
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

// AwaitStore blocks until the store takes a claim again, trying every
// StoreRetryInterval, or until ctx ends (then it returns ctx's error). An
// adapter calls it while it holds a delivery that Process answered Hold
// with a store error (Decision.AwaitsStore), and takes no new message
// meanwhile: none could be processed. Once the inbox is closed it returns
// idem.ErrClosed.
func (in *Inbox) AwaitStore(ctx context.Context) error {
	for {
		switch err := in.checkStore(ctx); {
		case err == nil:
			return nil
		case errors.Is(err, idem.ErrClosed):
			return err
		}
		t := time.NewTimer(in.config.StoreRetryInterval)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// probeKey is the key the store checks claim and release. Key never
// returns it: it hashes every id that starts with "sha256:", into 64 hex
// digits.
const probeKey = hashedPrefix + "store-check"

// checkStore claims and releases probeKey, and returns the store's error
// (a *idem.StoreError) if that failed, or idem.ErrClosed once the inbox
// is closed. A claim lost to another check counts as an answer.
func (in *Inbox) checkStore(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, in.engine.Config().CleanupTimeout)
	defer cancel()
	_, err := in.engine.Do(ctx, idem.Operation{Tenant: in.tenant, Key: probeKey}, func(ctx context.Context) (idem.Result, error) {
		idem.NotExecuted(ctx)
		return idem.Result{Mode: idem.ModeMarker, Status: http.StatusNoContent}, nil
	})
	if err == nil || errors.Is(err, idem.ErrInFlight) {
		return nil
	}
	if errors.Is(err, idem.ErrClosed) {
		return err
	}
	if !errors.Is(err, idem.ErrStore) {
		err = &idem.StoreError{Op: "check", Err: err}
	}
	in.storeEpoch.Add(1)
	return err
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

// maxFieldText bounds the error and subject kept in a poison record.
const maxFieldText = 4096

// fieldText returns s fit for a stored header value: control characters
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

// Status codes stored in idem.Result.Status for consumer records.
const (
	statusProcessed = 200
	statusPoison    = 599
	// statusLastRun marks the record of a message's last run (lastRun).
	statusLastRun = 598
)

// Header names of a poison record's idem.Result.Header.
const (
	headerError    = "Ideminbox-Error"
	headerAttempt  = "Ideminbox-Attempt"
	headerSubject  = "Ideminbox-Subject"
	headerDataSize = "Ideminbox-Data-Size"
)
