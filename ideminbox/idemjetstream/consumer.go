package idemjetstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
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

	// ObserveFunc, when set, is called for every keyed delivery once the
	// inbox has decided, after any commit and before the acknowledgement,
	// with the decision and its error: for metrics, tracing or tests
	// (a crash here is a crash between commit and ack). It must not
	// acknowledge the delivery.
	ObserveFunc func(msg jetstream.Msg, d ideminbox.Decision, err error)

	// Logger receives a line for every delivery that was not simply acked
	// (failures, poison, in flight, acknowledgement errors). Defaults to
	// the inbox's logger.
	Logger *slog.Logger

	// ProgressInterval is how often a message whose handler is still
	// running is reported in progress to the server (msg.InProgress),
	// which restarts its AckWait: a handler slower than AckWait then keeps
	// its message instead of the server sending a copy to another
	// instance (which the inbox would answer "in flight", nack, and see
	// again until the first one finishes). Zero means a third of the
	// consumer's AckWait in Consume, and never in Handle, which does not
	// know it; negative turns it off.
	ProgressInterval time.Duration
}

// Consumer runs a handler through an inbox for JetStream messages. It is
// safe for concurrent use; run one per process and consumer, or several
// competing ones: the inbox keeps their effects at one per message.
type Consumer struct {
	inbox   *ideminbox.Inbox
	handler HandlerFunc
	keyFunc func(jetstream.Msg) (string, error)
	logger  *slog.Logger
	// progress is Config.ProgressInterval.
	progress time.Duration

	observe func(jetstream.Msg, ideminbox.Decision, error)
}

// New returns a consumer running handler through inbox. A nil config means
// the defaults.
func New(inbox *ideminbox.Inbox, handler HandlerFunc, config *Config) (*Consumer, error) {
	if inbox == nil || handler == nil {
		return nil, errors.New("idemjetstream: New needs an inbox and a handler")
	}
	c := &Consumer{inbox: inbox, handler: handler, keyFunc: DefaultKey, logger: inbox.Config().Logger}
	if config != nil {
		if config.KeyFunc != nil {
			c.keyFunc = config.KeyFunc
		}
		if config.Logger != nil {
			c.logger = config.Logger
		}
		c.observe = config.ObserveFunc
		c.progress = config.ProgressInterval
	}
	return c, nil
}

// DefaultKey returns the message's Nats-Msg-Id header or, when it has
// none, "<stream>:<stream sequence>".
func DefaultKey(msg jetstream.Msg) (string, error) {
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		return id, nil
	}
	md, err := msg.Metadata()
	if err != nil {
		return "", fmt.Errorf("idemjetstream: no %s header and no metadata: %w", jetstream.MsgIDHeader, err)
	}
	return md.Stream + ":" + strconv.FormatUint(md.Sequence.Stream, 10), nil
}

// Handle processes one message and acknowledges it according to the
// inbox's decision, after the commit. It returns the decision and the
// error that explains it (see ideminbox.Inbox.Process), or the error of
// the acknowledgement.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg) (ideminbox.Decision, error) {
	return c.handle(ctx, msg, c.progress)
}

// handle is Handle, reporting progress every interval while the message
// is processed (not when interval ≤ 0).
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg, interval time.Duration) (ideminbox.Decision, error) {
	id, err := c.keyFunc(msg)
	if err != nil {
		// Without a key the message cannot be processed safely; Term hands
		// it to the server's advisories instead of running it unprotected
		// or redelivering it forever.
		return ideminbox.Decision{Action: ideminbox.Reject}, errors.Join(err, msg.Term())
	}
	m := ideminbox.Message{ID: id, Subject: msg.Subject(), Data: msg.Data(), Raw: msg}
	if md, err := msg.Metadata(); err == nil {
		m.Attempt = int(min(md.NumDelivered, 1<<31-1))
	}
	stop := reportProgress(msg, interval)
	d, err := c.inbox.Process(ctx, m, func(ctx context.Context) error { return c.handler(ctx, msg) })
	stop()
	if c.observe != nil {
		c.observe(msg, d, err)
	}
	var ackErr error
	switch d.Action {
	case ideminbox.Ack, ideminbox.AckDuplicate, ideminbox.AckPoison:
		ackErr = msg.Ack()
	case ideminbox.Nack:
		if d.Delay > 0 {
			ackErr = msg.NakWithDelay(d.Delay)
		} else {
			ackErr = msg.Nak()
		}
	case ideminbox.Reject:
		ackErr = msg.Term()
	}
	if ackErr != nil {
		// Nothing is lost: the server redelivers after AckWait, and the
		// inbox recognises the message if it was processed.
		ackErr = fmt.Errorf("idemjetstream: %s: %w", d.Action, ackErr)
	}
	return d, errors.Join(err, ackErr)
}

// Consume runs Handle for every message of cons until ctx ends, then stops
// fetching, lets the message in hand finish, and returns nil; or until
// nats.go ends the consumption (consumer deleted, connection closed), then
// it returns ErrClosed. Handlers run
// one at a time per Consume call; run several Consume calls (or processes)
// for parallelism. It refuses a consumer whose MaxDeliver would make the
// server drop a message before the inbox could treat it as poison.
func (c *Consumer) Consume(ctx context.Context, cons jetstream.Consumer, opts ...jetstream.PullConsumeOpt) error {
	if info := cons.CachedInfo(); info != nil {
		md, cfg := info.Config.MaxDeliver, c.inbox.Config()
		if md > 0 && md <= cfg.MaxAttempts {
			return fmt.Errorf("idemjetstream: consumer %q has MaxDeliver %d, not above the inbox's MaxAttempts %d: the server would drop failing messages before they are recorded as poison",
				info.Name, md, cfg.MaxAttempts)
		}
		if k := c.inbox.InFlightDeliveries(); md > 0 && md <= k {
			return fmt.Errorf("idemjetstream: consumer %q has MaxDeliver %d: a message whose holder crashed may be answered \"in flight\" %d times (the lease, %v, over InFlightDelay, %v) before its key can be taken over, and the server would drop it before it ever ran; use -1, or more than %d",
				info.Name, md, k, cfg.Engine.Config().Lease, cfg.InFlightDelay, k)
		}
	}
	progress := c.progress
	if info := cons.CachedInfo(); progress == 0 && info != nil {
		progress = info.Config.AckWait / 3
	}
	// A message in hand when ctx ends still runs to its commit and its
	// ack: cancelling it would only waste the work and cause a redelivery.
	work := context.WithoutCancel(ctx)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		d, err := c.handle(work, msg, progress)
		c.log(ctx, msg, d, err)
	}, opts...)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		cc.Stop()
		<-cc.Closed()
		return nil
	case <-cc.Closed():
		// nats.go ended the consumption itself: the consumer was deleted
		// or the connection closed. Nothing more will come; say so, so
		// that the caller can start again.
		if ctx.Err() != nil {
			return nil
		}
		return ErrClosed
	}
}

// ErrClosed is returned by Consume when the consumption ends without ctx
// ending: the consumer was deleted, or the connection closed (or, with
// jetstream.StopAfter among the options, the count was reached). Messages not
// acknowledged are redelivered after AckWait, to this or another instance.
var ErrClosed = errors.New("idemjetstream: the consumption was closed (consumer deleted or connection closed)")

// reportProgress tells the server every interval that msg is still being
// worked on, until the returned function is called. The reports are best
// effort: one that fails leaves the server to redeliver after AckWait,
// which the inbox handles.
func reportProgress(msg jetstream.Msg, interval time.Duration) (stop func()) {
	if interval <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		for {
			select {
			case <-done:
				return
			case <-ticker.C:
				_ = msg.InProgress()
			}
		}
	}()
	return func() {
		close(done)
		<-finished // no report may follow the acknowledgement
	}
}

func (c *Consumer) log(ctx context.Context, msg jetstream.Msg, d ideminbox.Decision, err error) {
	if err == nil {
		return
	}
	level := slog.LevelWarn
	switch {
	case d.Action == ideminbox.Reject || d.Action == ideminbox.AckPoison:
		level = slog.LevelError
	case d.Action == ideminbox.Nack && errors.Is(err, idem.ErrInFlight):
		level = slog.LevelInfo
	}
	c.logger.Log(ctx, level, "idemjetstream: message not processed",
		slog.String("subject", msg.Subject()), slog.String("id", msg.Headers().Get(nats.MsgIdHdr)),
		slog.String("decision", d.Action.String()), slog.Duration("delay", d.Delay), slog.Any("error", err))
}
