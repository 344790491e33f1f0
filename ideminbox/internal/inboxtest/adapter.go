package inboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/internal/atonce"
)

// Destination is what a broker adapter gives ExerciseAdapter: one fresh
// destination on a real broker (a JetStream stream and its durable
// consumer, a RabbitMQ queue), with no delivery limit, and the few calls
// the suite makes on it.
type Destination interface {
	// Publish sends a message whose id (the inbox's key) is id, or a
	// message without any id when id is "". Copies of one id must all be
	// delivered: the broker's own deduplication of publishes, if any, must
	// not see them.
	Publish(t testing.TB, id string, data []byte)

	// Consume starts one consumer instance of the adapter (its own
	// connection) running every delivery through inbox, with handler as
	// its handler: handler receives the message's id. It returns kill,
	// which stops the instance as a crash would: its connection is closed
	// with the deliveries it holds unsettled, and the broker delivers
	// them again (at once, or after its acknowledgement deadline). A
	// handler still running in a killed instance may go on; what it then
	// does is settled on a connection that is gone.
	Consume(t testing.TB, inbox *ideminbox.Inbox, handler func(ctx context.Context, id string) error) (kill func())

	// Pending returns how many messages the broker still holds for the
	// destination: not acknowledged yet, ready or delivered. After every
	// case it must come down to 0, once the consumers are stopped.
	Pending(t testing.TB) int
}

// ExerciseAdapter runs the adapter conformance suite: every case on a
// fresh Destination from open, with the inbox's records and the handler's
// effects in a SQLite database (effects commit with the dedup record).
//
//   - Duplicates: copies of one message published at one barrier and
//     delivered to competing instances at once take effect once, and are
//     all acknowledged.
//   - FailedHandlerRedelivered: a handler that fails gets the message
//     again, and its second run takes effect.
//   - Poison: a handler that always fails runs MaxAttempts times, then the
//     message is recorded as poison, dead-lettered once and acknowledged.
//   - KillRedelivers: an instance killed while its handler runs gives the
//     message back; the redelivery finds the committed effect and is
//     acknowledged as a duplicate, without a second effect.
//   - NoIDRejected: a message published without an id (Publish with id
//     "") never runs, and is given back for good: the broker holds it no
//     more.
//
// A case runs each instance with its own store connections, as a separate
// process would.
func ExerciseAdapter(t *testing.T, open func(t *testing.T) Destination) {
	t.Run("Duplicates", func(t *testing.T) { adapterDuplicates(newAdapterCase(t, open, 5)) })
	t.Run("FailedHandlerRedelivered", func(t *testing.T) { adapterRedelivered(newAdapterCase(t, open, 5)) })
	t.Run("Poison", func(t *testing.T) { adapterPoison(newAdapterCase(t, open, 3)) })
	t.Run("KillRedelivers", func(t *testing.T) { adapterKill(newAdapterCase(t, open, 5)) })
	t.Run("NoIDRejected", func(t *testing.T) { adapterNoID(newAdapterCase(t, open, 5)) })
}

// adapterCase is one case: its destination, its database, and what every
// inbox answered.
type adapterCase struct {
	t           *testing.T
	dest        Destination
	b           *Backend
	maxAttempts int

	mu        sync.Mutex
	decisions []ideminbox.Action // every answer of every inbox: a case has one message id
	onHold    func()             // called at each Hold, when set
	deadLets  map[string]int
	kills     []func()
	closes    []func()
}

func newAdapterCase(t *testing.T, open func(t *testing.T) Destination, maxAttempts int) *adapterCase {
	c := &adapterCase{t: t, dest: open(t), b: SQLite(t), maxAttempts: maxAttempts,
		deadLets: map[string]int{}}
	t.Cleanup(c.stopAll)
	return c
}

// start runs one more instance with its own store connections and inbox.
func (c *adapterCase) start(handler func(ctx context.Context, id string) error) (kill func()) {
	t := c.t
	t.Helper()
	engine, err := idem.NewEngine(c.b.NewStore(t), &idem.Config{Lease: 2 * time.Second, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{
		Consumer:       "conformance",
		MaxAttempts:    c.maxAttempts,
		InFlightDelay:  20 * time.Millisecond,
		RetryDelayFunc: func(int) time.Duration { return 10 * time.Millisecond },
		DeadLetterFunc: func(ctx context.Context, msg ideminbox.Message, cause error) error {
			if err := c.b.Insert(ctx, DeadLetters, msg.ID, cause.Error()); err != nil {
				return err
			}
			c.mu.Lock()
			c.deadLets[msg.ID]++
			c.mu.Unlock()
			return nil
		},
		Tracer: (*decisionTracer)(c),
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	destKill := c.dest.Consume(t, inbox, handler)
	kill = func() { once.Do(destKill) }
	c.mu.Lock()
	c.kills = append(c.kills, kill)
	c.closes = append(c.closes, func() {
		_ = inbox.Close(context.Background())
		_ = engine.Close(context.Background())
	})
	c.mu.Unlock()
	return kill
}

// stopAll kills every instance, then closes their inboxes: an inbox
// closes once its handlers have returned.
func (c *adapterCase) stopAll() {
	c.mu.Lock()
	kills, closes := c.kills, c.closes
	c.closes = nil
	c.mu.Unlock()
	for _, k := range kills {
		k()
	}
	for _, cl := range closes {
		cl()
	}
}

// quietLogger drops the warnings of the failures the cases cause on
// purpose.
var quietLogger = slog.New(slog.DiscardHandler)

// decisionTracer records every answer of the case's inboxes.
type decisionTracer adapterCase

func (d *decisionTracer) TraceMessageStart(ctx context.Context, _ ideminbox.TraceMessageStartData) context.Context {
	return ctx
}

func (d *decisionTracer) TraceMessageEnd(_ context.Context, data ideminbox.TraceMessageEndData) {
	d.mu.Lock()
	d.decisions = append(d.decisions, data.Action)
	hold := d.onHold
	d.mu.Unlock()
	if hold != nil && data.Action == ideminbox.Hold {
		hold()
	}
}

// effect is the handler's work: a row through the store's transaction.
func (c *adapterCase) effect(ctx context.Context, id string) error {
	return c.b.Insert(ctx, Effects, id, "effect")
}

func (c *adapterCase) effects(id string) int { return Count(c.b.Rows(c.t, Effects))[id] }

// eventually waits until cond holds, failing the case with what when it
// does not within a generous deadline: a bound against hanging, not a
// measure of speed.
func (c *adapterCase) eventually(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settled stops every instance and checks that the broker holds nothing
// more: every delivery was acknowledged.
func (c *adapterCase) settled() {
	c.t.Helper()
	c.eventually("the broker holds no message of the destination", func() bool { return c.dest.Pending(c.t) == 0 })
	c.stopAll()
	if n := c.dest.Pending(c.t); n != 0 {
		c.t.Fatalf("%d messages pending after the consumers stopped", n)
	}
}

func adapterDuplicates(c *adapterCase) {
	const copies, instances = 4, 3
	var (
		mu   sync.Mutex
		runs int
	)
	// The first run waits until another copy has met it in flight (or a
	// while, should every copy have reached one instance): the copies are
	// then in the inbox at the same time, not one after the other.
	met := make(chan struct{})
	var metOnce sync.Once
	handler := func(ctx context.Context, id string) error {
		mu.Lock()
		runs++
		first := runs == 1
		mu.Unlock()
		if first {
			select {
			case <-met:
			case <-time.After(3 * time.Second):
			}
		}
		return c.effect(ctx, id)
	}
	c.mu.Lock()
	c.onHold = func() { metOnce.Do(func() { close(met) }) }
	c.mu.Unlock()
	for range instances {
		c.start(handler)
	}
	atonce.Run(copies, func(int) { c.dest.Publish(c.t, "order-1", []byte(`{"id":1}`)) })
	c.eventually(fmt.Sprintf("%d copies acknowledged", copies), func() bool { return c.acked("order-1") == copies })
	c.settled()
	if !slicesContains(c.decisionsOf("order-1"), ideminbox.Hold) {
		c.t.Fatalf("no copy met another in flight: the copies were processed one after the other, which proves nothing (decisions %v)", c.decisionsOf("order-1"))
	}
	if n := c.effects("order-1"); n != 1 {
		c.t.Fatalf("%d copies delivered at once took effect %d times, want 1 (decisions %v)", copies, n, c.decisionsOf("order-1"))
	}
}

func adapterRedelivered(c *adapterCase) {
	var (
		mu   sync.Mutex
		runs int
	)
	c.start(func(ctx context.Context, id string) error {
		mu.Lock()
		runs++
		n := runs
		mu.Unlock()
		if err := c.effect(ctx, id); err != nil {
			return err
		}
		if n == 1 {
			return errors.New("the first run fails: its effect rolls back")
		}
		return nil
	})
	c.dest.Publish(c.t, "order-2", []byte(`{"id":2}`))
	c.eventually("the message redelivered after its handler failed, and acknowledged", func() bool { return c.acked("order-2") >= 1 })
	c.settled()
	mu.Lock()
	defer mu.Unlock()
	if runs != 2 || c.effects("order-2") != 1 {
		c.t.Fatalf("handler ran %d times, %d effects; want 2 runs (a failure, then its redelivery) and 1 effect (decisions %v)", runs, c.effects("order-2"), c.decisionsOf("order-2"))
	}
}

func adapterPoison(c *adapterCase) {
	var (
		mu   sync.Mutex
		runs int
	)
	c.start(func(ctx context.Context, id string) error {
		mu.Lock()
		runs++
		mu.Unlock()
		return errors.New("malformed order")
	})
	c.dest.Publish(c.t, "order-3", []byte(`{"id":`))
	c.eventually("the message recorded as poison and acknowledged", func() bool {
		d := c.decisionsOf("order-3")
		return len(d) > 0 && d[len(d)-1] == ideminbox.AckPoison
	})
	c.settled()
	mu.Lock()
	defer mu.Unlock()
	if runs != c.maxAttempts {
		c.t.Fatalf("a failing handler ran %d times, want MaxAttempts %d (decisions %v)", runs, c.maxAttempts, c.decisionsOf("order-3"))
	}
	c.mu.Lock()
	dl := c.deadLets["order-3"]
	c.mu.Unlock()
	if dl != 1 || Count(c.b.Rows(c.t, DeadLetters))["order-3"] != 1 {
		c.t.Fatalf("dead-lettered %d times, %d rows; want once", dl, Count(c.b.Rows(c.t, DeadLetters))["order-3"])
	}
	// A fresh inbox over the same records sees the poison record.
	engine, err := idem.NewEngine(c.b.NewStore(c.t), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "conformance"})
	if err != nil {
		c.t.Fatal(err)
	}
	st, err := inbox.Status(context.Background(), "order-3")
	if err != nil || st.State != ideminbox.StatePoison || st.Attempt != c.maxAttempts || string(st.Data) != `{"id":` {
		c.t.Fatalf("Status = %+v, %v; want poison after attempt %d with its payload", st, err, c.maxAttempts)
	}
}

func adapterKill(c *adapterCase) {
	started := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	kill := c.start(func(ctx context.Context, id string) error {
		first := false
		once.Do(func() { first = true })
		if first {
			close(started)
			<-release // killed meanwhile; then it commits, and its ack has no connection
		}
		return c.effect(ctx, id)
	})
	c.dest.Publish(c.t, "order-4", []byte(`{"id":4}`))
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		c.t.Fatal("the message never reached the handler")
	}
	kill()
	close(release)
	c.start(c.effect)
	c.eventually("the killed instance's message redelivered and acknowledged as a duplicate", func() bool {
		return slicesContains(c.decisionsOf("order-4"), ideminbox.AckDuplicate)
	})
	c.settled()
	if n := c.effects("order-4"); n != 1 {
		c.t.Fatalf("%d effects, want 1 (decisions %v)", n, c.decisionsOf("order-4"))
	}
}

func adapterNoID(c *adapterCase) {
	var (
		mu   sync.Mutex
		runs int
	)
	c.start(func(ctx context.Context, id string) error {
		mu.Lock()
		runs++
		mu.Unlock()
		return c.effect(ctx, id)
	})
	c.dest.Publish(c.t, "", []byte(`{"id":5}`))
	c.eventually("the message without an id rejected", func() bool {
		return slicesContains(c.decisionsOf(""), ideminbox.Reject)
	})
	c.settled()
	mu.Lock()
	defer mu.Unlock()
	if runs != 0 {
		c.t.Fatalf("a message without an id ran %d times, want never (decisions %v)", runs, c.decisionsOf(""))
	}
}

func slicesContains(s []ideminbox.Action, a ideminbox.Action) bool {
	for _, x := range s {
		if x == a {
			return true
		}
	}
	return false
}

// decisionsOf returns every answer of the case's inboxes; id, the case's
// one message, names it for the reader.
func (c *adapterCase) decisionsOf(id string) []ideminbox.Action {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]ideminbox.Action(nil), c.decisions...)
}

// acked counts the deliveries of id the inboxes answered with an
// acknowledgement.
func (c *adapterCase) acked(id string) int {
	n := 0
	for _, a := range c.decisionsOf(id) {
		if a == ideminbox.Ack || a == ideminbox.AckDuplicate || a == ideminbox.AckPoison {
			n++
		}
	}
	return n
}
