package ideminbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// means its documented default.
type Config struct {
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
	// idemjanitor.Janitor. Defaults to 7 days.
	Retention time.Duration

	// LocalAttemptsLimit bounds the messages whose deliveries this
	// process remembers (see MaxAttempts, and Message.Attempt for brokers
	// that keep no count). Defaults to 10000; past it the oldest are
	// forgotten.
	LocalAttemptsLimit int

	// Logger is the adapters' default logger. Defaults to the engine's
	// logger.
	Logger *slog.Logger

	// Tracer observes every message Process handles (see MessageTracer).
	// Defaults to none. The engine's tracer (idem.Config.Tracer) still
	// observes the operations and store calls the inbox makes: give a
	// tracer that implements both (idemprom's Collector, idemotel's
	// Tracer) to both.
	Tracer MessageTracer
}

// Inbox processes each message at most once per consumer, with the
// message id as key: claim, run the handler in the store's transaction,
// commit the dedup record in that same transaction. It answers what to do
// with the delivery (a Decision); the acknowledgement must be sent only
// after Process returns, which is after the commit.
//
// An Inbox is safe for concurrent use.
type Inbox struct {
	engine *idem.Engine // the inbox's own, over the given engine's store
	store  idem.Store
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

// NewInbox returns an inbox whose records engine's store keeps, or an
// error when config is unusable: no Consumer, or a Consumer that is not
// printable text (see Config.Consumer).
//
// The inbox runs an engine of its own, with engine's store and settings
// (Lease, Heartbeat, CleanupTimeout, Logger, Tracer) and Config.Retention
// in place of engine's: consumer keys must outlive broker redelivery
// windows, which are far longer than an HTTP client's retries, and the
// engine keeps one retention for all its keys. HTTP keys and consumer
// keys may so share a store: their tenants never meet (see Tenant).
// Closing engine does not close the inbox: call Inbox.Close.
func NewInbox(engine *idem.Engine, config *Config) (*Inbox, error) {
	if engine == nil {
		return nil, errors.New("ideminbox: NewInbox needs an engine")
	}
	if config == nil {
		return nil, errors.New("ideminbox: NewInbox needs a Config with its Consumer")
	}
	cfgCopy := *config
	config = &cfgCopy
	if config.Consumer == "" {
		return nil, errors.New("ideminbox: Config.Consumer is required")
	}
	if err := validateConsumer(config.Consumer); err != nil {
		return nil, err
	}
	if config.Retention <= 0 {
		config.Retention = DefaultRetention
	}
	ec := engine.Config()
	ec.Retention = config.Retention
	own, err := idem.NewEngine(engine.Store(), &ec)
	if err != nil {
		return nil, err
	}
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
		config.Logger = ec.Logger
	}
	return &Inbox{
		engine: own,
		store:  engine.Store(),
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

// Config returns the inbox's configuration with defaults filled in.
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
