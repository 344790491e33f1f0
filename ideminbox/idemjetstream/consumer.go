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
	handler HandlerFunc
	keyFunc func(jetstream.Msg) (string, error)
	logger  *slog.Logger
	// progress is Config.ProgressInterval.
	progress time.Duration
	observe  func(jetstream.Msg, ideminbox.Decision, error)

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
	c := &Consumer{
		inbox: inbox, handler: handler, keyFunc: DefaultKey, logger: inbox.Config().Logger,
		checked: make(map[consumerName]time.Duration),
	}
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
	p := newProgress(every)
	defer p.close()
	p.add(msg)
	d, err := c.process(ctx, ctx, msg, true)
	p.remove(msg)
	return d, errors.Join(err, c.settle(msg, d))
}

// process runs msg through the inbox with work as the handler's context,
// holding it in place while the store is down (and, when inPlace, while
// its key is in flight elsewhere) until ctx ends. It settles nothing but a
// message that cannot be keyed (Term).
func (c *Consumer) process(work, ctx context.Context, msg jetstream.Msg, inPlace bool) (ideminbox.Decision, error) {
	id, err := c.keyFunc(msg)
	if err != nil {
		// Without a key the message cannot be processed safely; Term hands
		// it to the server's advisories instead of running it unprotected
		// or redelivering it forever.
		return ideminbox.Decision{Action: ideminbox.Reject}, err
	}
	m := ideminbox.Message{ID: id, Subject: msg.Subject(), Data: msg.Data(), Raw: msg}
	if md, err := msg.Metadata(); err == nil {
		m.Attempt = int(min(md.NumDelivered, 1<<31-1))
	}
	for {
		d, err := c.inbox.Process(work, m, func(ctx context.Context) error { return c.handler(ctx, msg) })
		if c.observe != nil {
			c.observe(msg, d, err)
		}
		if d.Action != ideminbox.Hold {
			return d, err
		}
		c.log(ctx, msg, d, err)
		switch {
		case d.AwaitsStore(err):
			if c.inbox.AwaitStore(ctx) != nil {
				return d, err
			}
		case !inPlace:
			return d, err
		default:
			if !sleep(ctx, d.Delay) {
				return d, err
			}
		}
	}
}

// settle tells the server the decision; a Hold, when it ends here (the
// caller is stopping), is given back at once.
func (c *Consumer) settle(msg jetstream.Msg, d ideminbox.Decision) error {
	var err error
	switch d.Action {
	case ideminbox.Ack, ideminbox.AckDuplicate, ideminbox.AckPoison:
		err = msg.Ack()
	case ideminbox.Nack:
		if d.Delay > 0 {
			err = msg.NakWithDelay(d.Delay)
		} else {
			err = msg.Nak()
		}
	case ideminbox.Hold:
		err = msg.Nak()
	case ideminbox.Reject:
		err = msg.Term()
	}
	if err != nil {
		// Nothing is lost: the server redelivers after AckWait, and the
		// inbox recognises the message if it was processed.
		return fmt.Errorf("idemjetstream: %s: %w", d.Action, err)
	}
	return nil
}

// maxAside bounds the messages one Consume call holds aside while their
// keys are in flight elsewhere; past it, it fetches no new message until
// one of them is settled.
const maxAside = 64

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

	p := newProgress(every)
	defer p.close()
	// A message in hand when ctx ends still runs to its commit and its
	// ack: cancelling it would only waste the work and cause a redelivery.
	work := context.WithoutCancel(ctx)

	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	fetched := make(chan jetstream.Msg)
	fetchEnd := make(chan error, 1)
	go func() { fetchEnd <- fetch(fetchCtx, cons, p, fetched) }()

	// Messages held aside come back through due when their delay is over,
	// or are given back when Consume returns.
	due := make(chan jetstream.Msg)
	stopAside := make(chan struct{})
	var aside sync.WaitGroup
	held := 0
	defer func() {
		close(stopAside)
		aside.Wait()
	}()
	holdAside := func(msg jetstream.Msg, delay time.Duration) {
		held++
		aside.Add(1)
		go func() {
			defer aside.Done()
			t := time.NewTimer(delay)
			defer t.Stop()
			select {
			case <-t.C:
				select {
				case due <- msg:
					return
				case <-stopAside:
				}
			case <-stopAside:
			}
			p.remove(msg)
			_ = msg.Nak()
		}()
	}

	run := func(msg jetstream.Msg) {
		d, err := c.process(work, ctx, msg, false)
		if d.Action == ideminbox.Hold && ctx.Err() == nil {
			holdAside(msg, d.Delay)
			return
		}
		p.remove(msg)
		err = errors.Join(err, c.settle(msg, d))
		if d.Action != ideminbox.Hold {
			c.log(ctx, msg, d, err)
		}
	}
	for {
		next := fetched
		if held >= maxAside {
			next = nil
		}
		select {
		case <-ctx.Done():
			stopFetch()
			<-fetchEnd
			return nil
		case err := <-fetchEnd:
			if ctx.Err() != nil {
				return nil
			}
			return errors.Join(ErrClosed, err)
		case msg := <-next:
			run(msg)
		case msg := <-due:
			held--
			run(msg)
		}
	}
}

// fetchRetry is the pause after a failed fetch before the next one.
const fetchRetry = 250 * time.Millisecond

// fetchWait is how long one pull waits for a message. A pull does not end
// when the connection closes; the next one fails at once, so this bounds
// how long Consume takes to notice.
const fetchWait = 2 * time.Second

// fetch pulls one message at a time and hands each to out, reporting it
// in progress from its arrival, until ctx ends (nil) or the consumer or
// the connection is gone (their error). A message it cannot hand over
// because ctx ended is given back.
func fetch(ctx context.Context, cons jetstream.Consumer, p *progress, out chan<- jetstream.Msg) error {
	for {
		pull, cancel := context.WithTimeout(ctx, fetchWait)
		batch, err := cons.Fetch(1, jetstream.FetchContext(pull))
		if err == nil {
			for msg := range batch.Messages() {
				p.add(msg)
				select {
				case out <- msg:
				case <-ctx.Done():
					p.remove(msg)
					_ = msg.Nak()
				}
			}
			err = batch.Error()
		}
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			continue
		}
		if closed(err) {
			return err
		}
		// A pull that failed otherwise (a reconnection, a timeout): make
		// sure the consumer still exists before pulling again.
		if _, ierr := cons.Info(ctx); ierr != nil && closed(ierr) {
			return ierr
		}
		if !sleep(ctx, fetchRetry) {
			return nil
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

// sleep waits d, or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// progress reports the messages it holds in progress every interval, until
// they are removed. The reports are best effort: one that fails leaves the
// server to redeliver after AckWait, which the inbox handles.
type progress struct {
	every time.Duration
	mu    sync.Mutex // held while reporting, so that no report follows a removal
	msgs  map[jetstream.Msg]struct{}
	stop  chan struct{}
	done  chan struct{}
}

func newProgress(every time.Duration) *progress {
	p := &progress{every: every, msgs: make(map[jetstream.Msg]struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if every <= 0 {
		close(p.done)
		return p
	}
	go p.report()
	return p
}

func (p *progress) report() {
	defer close(p.done)
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			for msg := range p.msgs {
				_ = msg.InProgress()
			}
			p.mu.Unlock()
		}
	}
}

func (p *progress) add(msg jetstream.Msg) {
	p.mu.Lock()
	p.msgs[msg] = struct{}{}
	p.mu.Unlock()
}

// remove stops the reports for msg; none is sent after it returns.
func (p *progress) remove(msg jetstream.Msg) {
	p.mu.Lock()
	delete(p.msgs, msg)
	p.mu.Unlock()
}

func (p *progress) close() {
	close(p.stop)
	<-p.done
}

func (c *Consumer) log(ctx context.Context, msg jetstream.Msg, d ideminbox.Decision, err error) {
	if err == nil {
		return
	}
	level := slog.LevelWarn
	switch {
	case d.Action == ideminbox.Reject || d.Action == ideminbox.AckPoison:
		level = slog.LevelError
	case d.Action == ideminbox.Hold && errors.Is(err, idem.ErrInFlight):
		level = slog.LevelInfo
	}
	c.logger.Log(ctx, level, "idemjetstream: message not processed",
		slog.String("subject", msg.Subject()), slog.String("id", msg.Headers().Get(nats.MsgIdHdr)),
		slog.String("decision", d.Action.String()), slog.Duration("delay", d.Delay), slog.Any("error", err))
}
