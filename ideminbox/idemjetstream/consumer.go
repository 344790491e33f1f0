package idemjetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
)

// HandlerFunc processes one message. ctx carries the store's transaction
// (see ideminbox.HandlerFunc); return an error to roll back and have the
// message redelivered.
type HandlerFunc func(ctx context.Context, msg jetstream.Msg) error

// Config configures a Consumer. The zero value means every default.
type Config struct {
	// KeyFunc returns the id of a message. Defaults to DefaultKey.
	KeyFunc func(msg jetstream.Msg) (string, error)

	// ObserveFunc, when set, is called for every answer of the inbox to a
	// keyed delivery, after any commit and before the acknowledgement,
	// with the decision and its error: for metrics, tracing or tests (a
	// crash here is a crash between commit and ack). A delivery held
	// (ideminbox.Hold) is observed each time it is processed. It must not
	// acknowledge the delivery.
	ObserveFunc func(msg jetstream.Msg, d ideminbox.Decision, err error)

	// Logger receives a line for every answer but a plain ack (failures,
	// poison, held messages, acknowledgement errors). Defaults to the
	// inbox's logger.
	Logger *slog.Logger

	// ProgressInterval is how often a message the consumer holds (its
	// handler running, waiting for the store to come back, or for another
	// instance to finish it, or fetched and waiting its turn) is reported
	// in progress to the server (msg.InProgress), which restarts its
	// AckWait: the server then neither sends a copy to another instance
	// nor counts a redelivery against MaxDeliver. Zero means a third of
	// the consumer's AckWait; negative turns the reports off. It must be
	// shorter than AckWait.
	ProgressInterval time.Duration
}

// Consumer runs a handler through an inbox for JetStream messages. It is
// safe for concurrent use; run one per process and consumer, or several
// competing ones: the inbox keeps their effects at one per message.
type Consumer struct {
	inbox   *ideminbox.Inbox
	keyFunc func(jetstream.Msg) (string, error)
	// progress is Config.ProgressInterval.
	progress time.Duration
	loop     *ideminbox.Loop[delivery]

	mu      sync.Mutex
	checked map[consumerName]time.Duration // consumers Check accepted: their progress interval
}

type consumerName struct{ stream, consumer string }

// NewConsumer returns a consumer running handler through inbox. A nil config means
// the defaults.
func NewConsumer(inbox *ideminbox.Inbox, handler HandlerFunc, config *Config) (*Consumer, error) {
	if inbox == nil || handler == nil {
		return nil, errors.New("idemjetstream: New needs an inbox and a handler")
	}
	c := &Consumer{inbox: inbox, keyFunc: DefaultKey, checked: make(map[consumerName]time.Duration)}
	lc := &ideminbox.LoopConfig[delivery]{
		Handler:   func(ctx context.Context, d delivery) error { return handler(ctx, d.msg) },
		DelaysNak: true, // NakWithDelay
		Name:      "idemjetstream",
		LogAttrs: func(d delivery) []slog.Attr {
			return []slog.Attr{slog.String("subject", d.msg.Subject()), slog.String("id", d.msg.Headers().Get(nats.MsgIdHdr))}
		},
	}
	if config != nil {
		if config.KeyFunc != nil {
			c.keyFunc = config.KeyFunc
		}
		lc.Logger = config.Logger
		if observe := config.ObserveFunc; observe != nil {
			lc.ObserveFunc = func(d delivery, dec ideminbox.Decision, err error) { observe(d.msg, dec, err) }
		}
		c.progress = config.ProgressInterval
	}
	loop, err := ideminbox.NewLoop(inbox, lc)
	if err != nil {
		return nil, err
	}
	c.loop = loop
	return c, nil
}

// delivery is a JetStream message as the inbox's delivery loop settles it.
type delivery struct {
	msg     jetstream.Msg
	keyFunc func(jetstream.Msg) (string, error)
}

func (d delivery) Message() (ideminbox.Message, error) {
	id, err := d.keyFunc(d.msg)
	if err != nil {
		return ideminbox.Message{}, err
	}
	m := ideminbox.Message{ID: id, Subject: d.msg.Subject(), Data: d.msg.Data(), Raw: d.msg}
	if md, err := d.msg.Metadata(); err == nil {
		m.Attempt = int(min(md.NumDelivered, 1<<31-1))
	}
	return m, nil
}

func (d delivery) Ack() error { return d.msg.Ack() }

func (d delivery) Nak(delay time.Duration) error {
	if delay > 0 {
		return d.msg.NakWithDelay(delay)
	}
	return d.msg.Nak()
}

// Term hands a message that cannot be keyed to the server's advisories
// instead of running it unprotected or redelivering it forever.
func (d delivery) Term() error       { return d.msg.Term() }
func (d delivery) InProgress() error { return d.msg.InProgress() }

// DefaultKey returns the message's Nats-Msg-Id header or, when it has
// none, "<stream>:<stream sequence>:<time stored, Unix nanoseconds>". The
// sequence alone would not do: a stream deleted and created again (or a
// memory stream lost with its server) numbers its messages from 1 again,
// and new messages would be taken for processed ones. The time the server
// stored the message, the same in every redelivery, tells them apart.
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	md, err := msg.Metadata()
	if err != nil {
		return "", fmt.Errorf("idemjetstream: no %s header and no metadata: %w", jetstream.MsgIDHeader, err)
	}
	return md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10) + ":" + strconv.FormatInt(md.Timestamp.UnixNano(), 10), nil
}

// ErrConsumerConfig is wrapped by the errors of Check (and so of Consume)
// for a JetStream consumer the inbox cannot work over.
var ErrConsumerConfig = errors.New("idemjetstream: consumer configuration unfit for the inbox")

// ErrNotChecked is wrapped by the error of Handle for a message of a
// consumer that Check has not accepted.
var ErrNotChecked = errors.New("idemjetstream: the message's consumer was not checked (call Consumer.Check first)")

// Check reads the configuration of cons from the server and refuses, with
// an error wrapping ErrConsumerConfig, a consumer over which the inbox
// could lose messages:
//
//   - an ack policy other than explicit: with AckAll, acknowledging a
//     message acknowledges every earlier one, including one whose handler
//     failed and was only negatively acknowledged; with AckNone nothing is
//     ever redelivered. Either way a failed message would be lost, never
//     retried nor recorded as poison;
//   - a finite MaxDeliver below the inbox's MinDeliveryLimit (MaxAttempts,
//     2 deliveries to end a crash loop, and room for deliveries given back
//     without running): the server would drop a message before the inbox
//     processed it or recorded it as poison. -1 (unlimited) is the advice;
//   - a ProgressInterval not shorter than AckWait.
//
// Consume calls it. Call it before Handle, which refuses the messages of
// consumers it did not accept, and again after a consumer was deleted and
// created anew under the same name.
func (c *Consumer) Check(ctx context.Context, cons jetstream.Consumer) error {
	_, err := c.check(ctx, cons)
	return err
}

// check is Check, returning the interval of progress reports for the
// consumer's messages.
func (c *Consumer) check(ctx context.Context, cons jetstream.Consumer) (time.Duration, error) {
	info, err := cons.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("idemjetstream: reading the consumer's configuration: %w", err)
	}
	cfg, in := info.Config, c.inbox.Config()
	if cfg.AckPolicy != jetstream.AckExplicitPolicy {
		return 0, fmt.Errorf("%w: consumer %q has ack policy %s; only explicit acknowledgement keeps a failed message: with %s, acknowledging a later message also acknowledges one whose handler failed, and with %s nothing is redelivered, so the message would be lost, neither retried nor recorded as poison; use jetstream.AckExplicitPolicy",
			ErrConsumerConfig, info.Name, cfg.AckPolicy, jetstream.AckAllPolicy, jetstream.AckNonePolicy)
	}
	if md, least := cfg.MaxDeliver, c.inbox.MinDeliveryLimit(); md > 0 && md < least {
		return 0, fmt.Errorf("%w: consumer %q has MaxDeliver %d, and the inbox may need more deliveries than that: MaxAttempts %d, 2 to end a crash loop, and %d for deliveries given back without running (a consumer stopping, crashing or missing AckWait while the store is down); past MaxDeliver the server drops a message the inbox has neither processed nor recorded as poison. Set MaxDeliver to -1 (unlimited: the inbox records poison messages itself), or at least %d",
			ErrConsumerConfig, info.Name, md, in.MaxAttempts, ideminbox.GivenBackMargin, least)
	}
	every := c.progress
	if every == 0 {
		every = cfg.AckWait / 3
	}
	if every > 0 && every >= cfg.AckWait {
		return 0, fmt.Errorf("%w: ProgressInterval %v is not shorter than consumer %q's AckWait %v: held messages would be redelivered",
			ErrConsumerConfig, every, info.Name, cfg.AckWait)
	}
	c.mu.Lock()
	c.checked[consumerName{info.Stream, info.Name}] = every
	c.mu.Unlock()
	return every, nil
}

// Handle processes one message and acknowledges it according to the
// inbox's decision, after the commit. It returns the decision and the
// error that explains it (see ideminbox.Inbox.Process), or the error of
// the acknowledgement.
//
// A message the inbox answers Hold is kept, reported in progress, and
// processed again in place (after the delay, or once the store answers):
// Handle may block for as long as the store is down, or a crashed
// holder's lease runs. When ctx ends first, the message is negatively
// acknowledged and the Hold decision returned.
//
// Handle reports the message in progress from its call on: a message
// that waited in a client buffer before it (Consumer.Messages, a large
// Fetch batch behind a slow handler) may have outlived its AckWait there,
// and the server then sent it again and counted one more delivery of it.
// Pull no more messages than the handler gets through within AckWait, or
// use Consume, which pulls one at a time and reports a waiting message in
// progress from its arrival.
//
// The message's consumer must have been accepted by Check: otherwise
// Handle returns an error wrapping ErrNotChecked, a zero Decision, and
// leaves the message untouched.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg) (ideminbox.Decision, error) {
	md, err := msg.Metadata()
	if err != nil {
		return ideminbox.Decision{}, fmt.Errorf("idemjetstream: not a JetStream message: %w", err)
	}
	c.mu.Lock()
	every, ok := c.checked[consumerName{md.Stream, md.Consumer}]
	c.mu.Unlock()
	if !ok {
		return ideminbox.Decision{}, fmt.Errorf("%w: stream %q, consumer %q", ErrNotChecked, md.Stream, md.Consumer)
	}
	return c.loop.WithProgressInterval(every).Handle(ctx, delivery{msg, c.keyFunc})
}

// Consume processes the messages of cons until ctx ends, then stops
// fetching, lets the message in hand finish, gives back the ones it holds
// (negative acknowledgement), and returns nil; or until the consumer is
// deleted or the connection closed, then it returns ErrClosed. It first
// runs Check, and returns its error.
//
// It fetches one message at a time, when it is ready to process it: a
// message never waits in a client buffer, where its AckWait would run out
// behind a slow handler and the server would send it again, counting one
// more delivery. Handlers run one at a time per Consume call; run several
// Consume calls (or processes) for parallelism. Every message it holds is
// reported in progress (Config.ProgressInterval):
//
//   - while the store is down, it holds the message in hand and fetches
//     nothing until the store answers again: an outage spends none of the
//     messages' deliveries;
//   - a message whose key another execution holds is held aside and
//     processed again after the inbox's InFlightDelay, while the next
//     messages are processed.
func (c *Consumer) Consume(ctx context.Context, cons jetstream.Consumer) error {
	every, err := c.check(ctx, cons)
	if err != nil {
		return err
	}

	err = c.loop.WithProgressInterval(every).Consume(ctx, func(ctx context.Context) (delivery, error) {
		msg, err := fetch(ctx, cons)
		return delivery{msg, c.keyFunc}, err
	})
	if err != nil {
		return errors.Join(ErrClosed, err)
	}
	return nil
}

// fetchRetry is the pause after a failed fetch before the next one.
const fetchRetry = 250 * time.Millisecond

// fetchWait is how long one pull waits for a message. A pull does not end
// when the connection closes; the next one fails at once, so this bounds
// how long Consume takes to notice.
const fetchWait = 2 * time.Second

// fetch pulls until it gets one message, and returns it, or until ctx
// ends (ctx's error) or the consumer or the connection is gone (their
// error). It pulls one message at a time: a message never waits in a
// client buffer, where its AckWait would run out unreported.
func fetch(ctx context.Context, cons jetstream.Consumer) (jetstream.Msg, error) {
	for {
		pull, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := cons.Fetch(1, jetstream.FetchContext(pull))
		if err == nil {
			for msg := range batch.Messages() {
				cancel()
				return msg, nil
			}
			err = batch.Error()
		}
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil {
			continue
		}
		if closed(err) {
			return nil, err
		}
		// A pull that failed otherwise (a reconnection, a timeout): make
		// sure the consumer still exists before pulling again.
		if _, ierr := cons.Info(ctx); ierr != nil && closed(ierr) {
			return nil, ierr
		}
		t := time.NewTimer(fetchRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

// closed reports an error after which no fetch can succeed.
func closed(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// ErrClosed is returned by Consume when the consumption ends without ctx
// ending: the consumer was deleted, or the connection closed. Messages not
// acknowledged are redelivered after AckWait, to this or another instance.
var ErrClosed = errors.New("idemjetstream: the consumption was closed (consumer deleted or connection closed)")
