package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
)

// ErrClosed is returned by Consume when the delivery channel closes: the
// AMQP channel or connection is gone. Unacknowledged deliveries return to
// the queue; reconnect and call Consume again.
var ErrClosed = errors.New("idemamqp: delivery channel closed")

// DeliveryCountHeader is the header in which quorum queues count the
// earlier deliveries of a message.
const DeliveryCountHeader = "x-delivery-count"

// DeliveryLimitArg is the queue argument that bounds the deliveries of a
// message in a quorum queue: past it RabbitMQ drops the message, or
// dead-letters it.
const DeliveryLimitArg = "x-delivery-limit"

// ErrQueueArgs is wrapped by the errors of CheckQueueArgs.
var ErrQueueArgs = errors.New("idemamqp: queue arguments unfit for the inbox")

// quorumDefaultLimit is the delivery limit RabbitMQ 4 gives a quorum queue
// declared without one (RabbitMQ 3 gives none).
const quorumDefaultLimit = 20

// CheckQueueArgs checks the arguments a queue is declared with (those
// passed to Channel.QueueDeclare), and refuses, with an error wrapping
// ErrQueueArgs, a delivery limit under which RabbitMQ could drop a message
// the inbox has neither processed nor recorded as poison:
//
//   - an x-delivery-limit of 0 or more, below the inbox's
//     MinDeliveryLimit (MaxAttempts, 2 deliveries to end a crash loop,
//     and room for the deliveries a consumer gives back without running
//     them when it stops, crashes or loses its channel while the store is
//     down: RabbitMQ counts every return);
//   - an x-delivery-limit that is not an integer;
//   - a quorum queue without x-delivery-limit, when MinDeliveryLimit is
//     above 20, the limit RabbitMQ 4 gives such a queue.
//
// An x-delivery-limit of -1 (no limit, RabbitMQ 4) is the advice: the
// inbox records poison messages itself. RabbitMQ tells no client the
// arguments of an existing queue, nor the policies that apply to it (a
// delivery-limit policy overrides the argument), so the consumer cannot
// check the queue it consumes: check the arguments you declare it with,
// and keep policies to the same bound.
func (c *Consumer) CheckQueueArgs(args amqp.Table) error {
	least := c.inbox.MinDeliveryLimit()
	fix := fmt.Sprintf("set %s to -1 (no limit: the inbox records poison messages itself), or at least %d", DeliveryLimitArg, least)
	v, ok := args[DeliveryLimitArg]
	if !ok {
		if qt, _ := args["x-queue-type"].(string); qt == "quorum" && least > quorumDefaultLimit {
			return fmt.Errorf("%w: a quorum queue declared without %s gets a limit of %d deliveries on RabbitMQ 4, and the inbox may need %d (MaxAttempts %d, 2 to end a crash loop, %d for deliveries given back without running); %s",
				ErrQueueArgs, DeliveryLimitArg, quorumDefaultLimit, least, c.inbox.Config().MaxAttempts, ideminbox.GivenBackMargin, fix)
		}
		return nil
	}
	limit, ok := integer(v)
	if !ok {
		return fmt.Errorf("%w: %s is %v (%T), not an integer; %s", ErrQueueArgs, DeliveryLimitArg, v, v, fix)
	}
	if limit >= 0 && limit < int64(least) {
		return fmt.Errorf("%w: %s is %d, and the inbox may need more deliveries than that: MaxAttempts %d, 2 to end a crash loop, and %d for deliveries given back without running (a consumer stopping, crashing or losing its channel while the store is down); past the limit RabbitMQ drops a message the inbox has neither processed nor recorded as poison. %s",
			ErrQueueArgs, DeliveryLimitArg, limit, c.inbox.Config().MaxAttempts, ideminbox.GivenBackMargin, strings.ToUpper(fix[:1])+fix[1:])
	}
	return nil
}

// integer returns v as an int64 when it is one of the integer types an
// AMQP table holds.
func integer(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case int32:
		return int64(x), true
	case int16:
		return int64(x), true
	case int8:
		return int64(x), true
	case int:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	}
	return 0, false
}

// HandlerFunc processes one delivery. ctx carries the store's transaction
// (see ideminbox.HandlerFunc); return an error to roll back and have the
// message redelivered. It must not acknowledge the delivery itself.
type HandlerFunc func(ctx context.Context, d amqp.Delivery) error

// Config configures a Consumer. The zero value means every default.
type Config struct {
	// KeyFunc returns the id of a delivery. Defaults to DefaultKey.
	KeyFunc func(d amqp.Delivery) (string, error)

	// ObserveFunc, when set, is called for every answer of the inbox to a
	// keyed delivery, after any commit and before the acknowledgement,
	// with the decision and its error: for metrics, tracing or tests (a
	// crash here is a crash between commit and ack). A delivery held
	// (ideminbox.Hold) is observed each time it is processed. It must not
	// acknowledge the delivery.
	ObserveFunc func(d amqp.Delivery, dec ideminbox.Decision, err error)

	// Logger receives a line for every answer but a plain ack (failures,
	// poison, held deliveries, acknowledgement errors). Defaults to the
	// inbox's logger.
	Logger *slog.Logger
}

// Consumer runs a handler through an inbox for RabbitMQ deliveries. It is
// safe for concurrent use; competing instances on one queue keep their
// effects at one per message.
type Consumer struct {
	inbox   *ideminbox.Inbox
	keyFunc func(amqp.Delivery) (string, error)
	loop    *ideminbox.Loop[delivery]
}

// NewConsumer returns a consumer running handler through inbox. A nil config means
// the defaults.
func NewConsumer(inbox *ideminbox.Inbox, handler HandlerFunc, config *Config) (*Consumer, error) {
	if inbox == nil || handler == nil {
		return nil, errors.New("idemamqp: New needs an inbox and a handler")
	}
	c := &Consumer{inbox: inbox, keyFunc: DefaultKey}
	lc := &ideminbox.LoopConfig[delivery]{
		Handler: func(ctx context.Context, d delivery) error { return handler(ctx, d.Delivery) },
		// RabbitMQ has no delayed requeue: the loop keeps a delivery to
		// requeue for its delay, unsettled, then requeues it.
		DelaysNak: false,
		Name:      "idemamqp",
		LogAttrs: func(d delivery) []slog.Attr {
			return []slog.Attr{slog.String("routing_key", d.RoutingKey), slog.String("message_id", d.MessageId)}
		},
	}
	if config != nil {
		if config.KeyFunc != nil {
			c.keyFunc = config.KeyFunc
		}
		lc.Logger = config.Logger
		if observe := config.ObserveFunc; observe != nil {
			lc.ObserveFunc = func(d delivery, dec ideminbox.Decision, err error) { observe(d.Delivery, dec, err) }
		}
	}
	loop, err := ideminbox.NewLoop(inbox, lc)
	if err != nil {
		return nil, err
	}
	c.loop = loop
	return c, nil
}

// delivery is an AMQP delivery as the inbox's delivery loop settles it.
type delivery struct {
	amqp.Delivery
	keyFunc func(amqp.Delivery) (string, error)
}

func (d delivery) Message() (ideminbox.Message, error) {
	id, err := d.keyFunc(d.Delivery)
	if err != nil {
		return ideminbox.Message{}, err
	}
	return ideminbox.Message{ID: id, Attempt: Attempt(d.Delivery), Subject: d.RoutingKey, Data: d.Body, Raw: d.Delivery}, nil
}

func (d delivery) Ack() error { return d.Delivery.Ack(false) }

// Nak requeues at once: the loop never passes a delay (DelaysNak false).
func (d delivery) Nak(time.Duration) error { return d.Nack(false, true) }

// Term rejects without requeue: to the queue's dead-letter exchange, if
// it has one.
func (d delivery) Term() error { return d.Reject(false) }

// InProgress does nothing: RabbitMQ keeps an unsettled delivery until the
// channel closes (or its consumer_timeout).
func (d delivery) InProgress() error { return nil }

// DefaultKey returns the delivery's MessageId, or an error wrapping
// ideminbox.ErrNoMessageID when the publisher set none.
func DefaultKey(d amqp.Delivery) (string, error) {
	if d.MessageId == "" {
		return "", fmt.Errorf("%w: the delivery has no MessageId property (exchange %q, routing key %q); set it when publishing, or give idemamqp.Config.KeyFunc",
			ideminbox.ErrNoMessageID, d.Exchange, d.RoutingKey)
	}
	return d.MessageId, nil
}

// Attempt returns the delivery number of d: x-delivery-count + 1 on quorum
// queues, 0 (unknown: the inbox counts) where the header is absent. The
// first delivery on a quorum queue carries no header either; the inbox's
// own count then says 1, which is right.
func Attempt(d amqp.Delivery) int {
	n, ok := integer(d.Headers[DeliveryCountHeader])
	if !ok || n < 0 || n >= 1<<31-1 {
		return 0
	}
	return int(n) + 1
}

// Handle processes one delivery and acknowledges it according to the
// inbox's decision, after the commit. For a Nack it holds the delivery for
// the decision's delay (less if ctx ends) before requeueing it: RabbitMQ
// has no delayed requeue. A delivery the inbox answers Hold is kept
// unsettled and processed again in place (after the delay, or once the
// store answers), so Handle may block for as long as the store is down or
// a crashed holder's lease runs; when ctx ends first, it is requeued and
// the Hold decision returned. It returns the decision and the error that
// explains it (see ideminbox.Inbox.Process), or the error of the
// acknowledgement.
func (c *Consumer) Handle(ctx context.Context, d amqp.Delivery) (ideminbox.Decision, error) {
	return c.loop.Handle(ctx, delivery{d, c.keyFunc})
}

// ConsumeQueue consumes queue on ch with manual acknowledgements and runs
// Consume on its deliveries; when Consume returns it cancels the broker
// consumer. Manual acknowledgement is the only mode in which the inbox can
// work: with autoAck the broker forgets each message as it sends it, and
// one whose handler failed is lost, neither retried nor recorded as
// poison. consumerTag may be empty: one is generated.
func (c *Consumer) ConsumeQueue(ctx context.Context, ch *amqp.Channel, queue, consumerTag string) error {
	if consumerTag == "" {
		consumerTag = "idemamqp-" + strconv.FormatUint(rand.Uint64(), 36)
	}
	deliveries, err := ch.Consume(queue, consumerTag, false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("idemamqp: consume %q: %w", queue, err)
	}
	defer func() { _ = ch.Cancel(consumerTag, false) }()
	return c.Consume(ctx, deliveries)
}

// Consume runs every delivery through the inbox until ctx ends (then it
// returns nil) or deliveries closes (then ErrClosed). Deliveries are
// processed one at a time; the one in hand when ctx ends still runs to its
// commit and ack. Open deliveries with autoAck false (ConsumeQueue does):
// nothing in a delivery tells, and with autoAck a failed message is lost.
// The channel's prefetch (Channel.Qos) bounds how many deliveries may be
// held.
//
//   - While the store is down, it holds the delivery in hand, unsettled,
//     and takes no other until the store answers again: an outage spends
//     none of the messages' deliveries (x-delivery-count), however long
//     it lasts, within the broker's consumer timeout (see the package
//     documentation).
//   - A delivery whose key another execution holds is kept aside,
//     unsettled, and processed again after the inbox's InFlightDelay,
//     while the next deliveries are processed.
//   - A delivery to requeue after a delay (its handler failed) is held
//     aside likewise, then requeued.
//
// When Consume returns, the deliveries it holds aside, and the one it took
// off deliveries for its next turn, are requeued at once. Deliveries the
// broker pushed that Consume had not taken yet stay
// unacknowledged: cancel the consumer (Channel.Cancel) or close the
// channel, and RabbitMQ puts them back in the queue; nothing is lost, and
// nothing ran, but a quorum queue counts one more delivery for each.
func (c *Consumer) Consume(ctx context.Context, deliveries <-chan amqp.Delivery) error {
	return c.loop.Consume(ctx, func(ctx context.Context) (delivery, error) {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return delivery{}, ErrClosed
			}
			return delivery{d, c.keyFunc}, nil
		case <-ctx.Done():
			return delivery{}, ctx.Err()
		}
	})
}
