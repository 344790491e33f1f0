package ideminbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Delivery is one delivery of a message as a broker adapter hands it to a
// Loop: the message, and the broker calls that settle it. The loop calls
// at most one of Ack, Nak and Term, once, after the inbox has answered
// (after the commit); InProgress any number of times before.
type Delivery interface {
	// Message returns what the inbox needs of the delivery, or an error
	// when it carries no usable id: the loop then terminates it (Term)
	// without running it, and answers Reject with that error (the inbox's
	// tracer sees a Reject; LoopConfig.ObserveFunc is not called).
	Message() (Message, error)
	// Ack acknowledges the delivery: the broker forgets the message.
	Ack() error
	// Nak gives the delivery back for a redelivery after delay, or at
	// once when delay is zero. The loop passes a delay only when
	// LoopConfig.DelaysNak says the broker can delay a redelivery.
	Nak(delay time.Duration) error
	// Term gives the delivery back for good, without requeue (to a
	// dead-letter exchange, for RabbitMQ; an advisory, for JetStream).
	Term() error
	// InProgress tells the broker the delivery is still being worked on
	// (JetStream restarts its AckWait). A broker without such a call
	// returns nil; set no LoopConfig.ProgressInterval then.
	InProgress() error
}

// LoopConfig configures a Loop: what a broker adapter says of its broker.
type LoopConfig[D Delivery] struct {
	// Handler does the work of a delivery's message; ctx carries the
	// store's transaction (see HandlerFunc). Required.
	Handler func(ctx context.Context, d D) error

	// ObserveFunc, when set, is called with every answer of the inbox to
	// a delivery that has a message, after any commit and before the
	// delivery is settled (a crash here is a crash between commit and
	// acknowledgement). A delivery held is observed each time it is
	// processed. It must not settle the delivery.
	ObserveFunc func(d D, dec Decision, err error)

	// DelaysNak is true when the broker delays a redelivery itself
	// (JetStream's NakWithDelay): a Nack is then given back at once with
	// its delay. When false (RabbitMQ requeues at once), the loop keeps the
	// delivery, unsettled, for the delay, then gives it back with Nak(0).
	DelaysNak bool

	// ProgressInterval is how often every delivery the loop holds (its
	// handler running, held while the store is down or its key is in
	// flight elsewhere, or waiting its turn) is reported InProgress.
	// Zero or negative: never.
	ProgressInterval time.Duration

	// Name starts the loop's log lines and errors ("idemjetstream").
	Name string

	// Logger receives a line for every answer but a plain ack. Defaults
	// to the inbox's logger.
	Logger *slog.Logger

	// LogAttrs returns the attributes that name a delivery in a log line
	// (its subject, its id). Optional.
	LogAttrs func(d D) []slog.Attr
}

// Loop is the delivery loop every broker adapter shares: it runs
// deliveries through an inbox, holds those the inbox answers Hold
// (in place while the store is down, aside while their key is in flight
// elsewhere), reports the deliveries it holds in progress, and settles
// each one only after the inbox has answered. An adapter implements
// Delivery for its broker's message, and calls Handle or Consume.
//
// A Loop is safe for concurrent use.
type Loop[D Delivery] struct {
	inbox  *Inbox
	config LoopConfig[D]
}

// NewLoop returns a loop running deliveries through inbox, or an error
// without an inbox or a Handler.
func NewLoop[D Delivery](inbox *Inbox, config *LoopConfig[D]) (*Loop[D], error) {
	if inbox == nil || config == nil || config.Handler == nil {
		return nil, errors.New("ideminbox: NewLoop needs an inbox and a LoopConfig with its Handler")
	}
	l := &Loop[D]{inbox: inbox, config: *config}
	if l.config.Logger == nil {
		l.config.Logger = inbox.config.Logger
	}
	if l.config.Name == "" {
		l.config.Name = "ideminbox"
	}
	return l, nil
}

// WithProgressInterval returns a copy of the loop that reports held
// deliveries in progress every interval instead: for an adapter whose
// interval depends on where the deliveries come from (a JetStream
// consumer's AckWait).
func (l *Loop[D]) WithProgressInterval(every time.Duration) *Loop[D] {
	c := *l
	c.config.ProgressInterval = every
	return &c
}

// Handle processes one delivery and settles it according to the inbox's
// decision, after the commit, and returns the decision and the error that
// explains it (see Inbox.Process), joined with the error of the
// settlement. A delivery the inbox answers Hold is kept, reported in
// progress, and processed again in place (after the delay, or once the
// store answers): Handle may block for as long as the store is down or a
// crashed holder's lease runs. A Nack the broker cannot delay is kept for
// its delay (less if ctx ends) before it is given back. When ctx ends
// while the delivery is held, it is given back at once and the Hold
// decision returned.
func (l *Loop[D]) Handle(ctx context.Context, d D) (Decision, error) {
	p := newProgress[D](l.config.ProgressInterval)
	defer p.close()
	h := p.add(d)
	dec, err := l.process(ctx, ctx, d, true)
	if dec.Action == Nack && !l.config.DelaysNak {
		sleep(ctx, dec.Delay)
	}
	p.remove(h)
	return dec, errors.Join(err, l.settle(d, dec))
}

// maxAside bounds the deliveries one Consume call holds aside (their key
// in flight elsewhere, or a Nack waiting its delay); past it, it takes no
// new delivery until one of them leaves.
const maxAside = 64

// Consume runs the deliveries next returns through the inbox, one at a
// time, until ctx ends (then it stops taking deliveries, lets the one in
// hand run to its commit and settlement, gives back the ones it holds,
// and returns nil) or next fails (then it returns next's error). next is
// called from a goroutine of its own, one call at a time; it must return
// when its ctx ends. A delivery next returned is reported in progress
// from then on, even while it waits its turn:
//
//   - while the store is down, the delivery in hand is held and nothing
//     else is taken until the store answers again: an outage spends none
//     of the messages' deliveries;
//   - a delivery whose key another execution holds is held aside and
//     processed again after the inbox's InFlightDelay, while the next
//     ones are processed;
//   - a Nack the broker cannot delay is held aside for its delay, then
//     given back.
func (l *Loop[D]) Consume(ctx context.Context, next func(ctx context.Context) (D, error)) error {
	p := newProgress[D](l.config.ProgressInterval)
	defer p.close()
	// A delivery in hand when ctx ends still runs to its commit and its
	// settlement: cancelling it would only waste the work and cause a
	// redelivery.
	work := context.WithoutCancel(ctx)

	type arrival struct {
		d D
		h *held[D]
	}
	fetchCtx, stopFetch := context.WithCancel(ctx)
	defer stopFetch()
	fetched := make(chan arrival)
	fetchEnd := make(chan error, 1)
	go func() {
		for {
			d, err := next(fetchCtx)
			if err != nil {
				fetchEnd <- err
				return
			}
			h := p.add(d)
			select {
			case fetched <- arrival{d, h}:
			case <-fetchCtx.Done():
				p.remove(h)
				_ = d.Nak(0)
				fetchEnd <- nil
				return
			}
		}
	}()

	// Deliveries held aside come back through due when their delay is
	// over (a Hold), or are given back then (a Nack); all are given back
	// at once when Consume returns. left counts those given back.
	due := make(chan arrival)
	left := make(chan struct{})
	stopAside := make(chan struct{})
	var aside sync.WaitGroup
	held := 0
	defer func() {
		close(stopAside)
		aside.Wait()
	}()
	holdAside := func(a arrival, dec Decision) {
		held++
		aside.Add(1)
		go func() {
			defer aside.Done()
			t := time.NewTimer(dec.Delay)
			defer t.Stop()
			select {
			case <-t.C:
				if dec.Action == Hold {
					select {
					case due <- a:
						return
					case <-stopAside:
					}
				}
			case <-stopAside:
			}
			p.remove(a.h)
			if err := l.settle(a.d, Decision{Action: Nack}); err != nil {
				l.log(ctx, a.d, dec, err)
			}
			select {
			case left <- struct{}{}:
			case <-stopAside:
			}
		}()
	}

	run := func(a arrival) {
		dec, err := l.process(work, ctx, a.d, false)
		if ctx.Err() == nil && (dec.Action == Hold || dec.Action == Nack && !l.config.DelaysNak && dec.Delay > 0) {
			holdAside(a, dec)
			if dec.Action == Nack {
				l.log(ctx, a.d, dec, err)
			}
			return
		}
		p.remove(a.h)
		err = errors.Join(err, l.settle(a.d, dec))
		if dec.Action != Hold {
			l.log(ctx, a.d, dec, err)
		}
	}
	for {
		in := fetched
		if held >= maxAside {
			in = nil
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
			return err
		case a := <-in:
			run(a)
		case a := <-due:
			held--
			run(a)
		case <-left:
			held--
		}
	}
}

// process runs d through the inbox with work as the handler's context,
// holding it in place while the store is down (and, when inPlace, while
// its key is in flight elsewhere) until ctx ends. It settles nothing.
func (l *Loop[D]) process(work, ctx context.Context, d D, inPlace bool) (Decision, error) {
	msg, err := d.Message()
	if err != nil {
		// Without a key the message cannot be processed safely: running
		// it would be the silent pass the inbox exists to prevent, and
		// giving it back would loop forever. The inbox answers a message
		// without an id Reject, and its tracer counts it as such.
		dec, _ := l.inbox.Process(work, Message{}, func(context.Context) error { return nil })
		return dec, err
	}
	for {
		dec, err := l.inbox.Process(work, msg, func(ctx context.Context) error { return l.config.Handler(ctx, d) })
		if l.config.ObserveFunc != nil {
			l.config.ObserveFunc(d, dec, err)
		}
		if dec.Action != Hold {
			return dec, err
		}
		l.log(ctx, d, dec, err)
		switch {
		case dec.AwaitsStore(err):
			if l.inbox.AwaitStore(ctx) != nil {
				return dec, err
			}
		case !inPlace:
			return dec, err
		default:
			if !sleep(ctx, dec.Delay) {
				return dec, err
			}
		}
	}
}

// settle tells the broker the decision; a Hold, when it ends here (the
// caller is stopping), is given back at once.
func (l *Loop[D]) settle(d D, dec Decision) error {
	var err error
	switch dec.Action {
	case Ack, AckDuplicate, AckPoison:
		err = d.Ack()
	case Nack:
		delay := dec.Delay
		if !l.config.DelaysNak {
			delay = 0 // waited already
		}
		err = d.Nak(delay)
	case Hold:
		err = d.Nak(0)
	case Reject:
		err = d.Term()
	}
	if err != nil {
		// Nothing is lost: the broker redelivers an unsettled delivery (after
		// AckWait, or when the channel closes), and the inbox recognises
		// the message if it was processed.
		return fmt.Errorf("%s: %s: %w", l.config.Name, dec.Action, err)
	}
	return nil
}

func (l *Loop[D]) log(ctx context.Context, d D, dec Decision, err error) {
	if err == nil {
		return
	}
	level := slog.LevelWarn
	switch {
	case dec.Action == Reject || dec.Action == AckPoison:
		level = slog.LevelError
	case dec.Action == Hold && errors.Is(err, idem.ErrInFlight):
		level = slog.LevelInfo
	}
	var attrs []slog.Attr
	if l.config.LogAttrs != nil {
		attrs = l.config.LogAttrs(d)
	}
	attrs = append(attrs, slog.String("decision", dec.Action.String()), slog.Duration("delay", dec.Delay), slog.Any("error", err))
	l.config.Logger.LogAttrs(ctx, level, l.config.Name+": message not processed", attrs...)
}

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

// held is a delivery the progress reporter knows: deliveries need not be
// comparable (a RabbitMQ delivery holds maps), their handles are.
type held[D Delivery] struct{ d D }

// progress reports the deliveries it holds in progress every interval,
// until they are removed. The reports are best effort: one that fails
// leaves the broker to redeliver, which the inbox handles.
type progress[D Delivery] struct {
	every time.Duration
	mu    sync.Mutex // held while reporting, so that no report follows a removal
	held  map[*held[D]]struct{}
	stop  chan struct{}
	done  chan struct{}
}

func newProgress[D Delivery](every time.Duration) *progress[D] {
	p := &progress[D]{every: every, held: make(map[*held[D]]struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	if every <= 0 {
		close(p.done)
		return p
	}
	go p.report()
	return p
}

func (p *progress[D]) report() {
	defer close(p.done)
	t := time.NewTicker(p.every)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			for h := range p.held {
				_ = h.d.InProgress()
			}
			p.mu.Unlock()
		}
	}
}

func (p *progress[D]) add(d D) *held[D] {
	h := &held[D]{d}
	p.mu.Lock()
	p.held[h] = struct{}{}
	p.mu.Unlock()
	return h
}

// remove stops the reports for h; none is sent after it returns.
func (p *progress[D]) remove(h *held[D]) {
	p.mu.Lock()
	delete(p.held, h)
	p.mu.Unlock()
}

func (p *progress[D]) close() {
	close(p.stop)
	<-p.done
}
