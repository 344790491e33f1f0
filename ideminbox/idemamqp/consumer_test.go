package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

// quiet drops the logs of the many failures the tests cause on purpose.
var quiet = inboxtest.Quiet

// queueTypes are the two kinds of queue: quorum queues count deliveries,
// classic ones do not (the inbox counts).
var queueTypes = []string{"quorum", "classic"}

// forEach runs fn on every queue type and backend, each time on a fresh
// queue and database.
func forEach(t *testing.T, fn func(t *testing.T, be *bench)) {
	for _, qt := range queueTypes {
		t.Run(qt, func(t *testing.T) {
			inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) { fn(t, newBench(t, b, qt)) })
		})
	}
}

// bench is one queue on the real broker, deleted at cleanup, and the
// decisions every instance took.
type bench struct {
	t         *testing.T
	b         *inboxtest.Backend
	url       string
	ch        *amqp.Channel
	queue     string
	queueType string
	args      amqp.Table

	*inboxtest.Tally // by message id; a delivery's number is Attempt's

	mu        sync.Mutex
	instances []*instance
}

func newBench(t *testing.T, b *inboxtest.Backend, queueType string) *bench {
	t.Helper()
	return newBenchArgs(t, b, amqp.Table{"x-queue-type": queueType})
}

// openBroker connects to the shared RabbitMQ (skipping t when there is
// none, as testenv.Unavailable says) and opens a channel, closed when t
// ends.
func openBroker(t *testing.T) (url string, conn *amqp.Connection, ch *amqp.Channel) {
	t.Helper()
	url = testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		testenv.Unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { conn.Close() })
	return url, conn, channel(t, conn)
}

// channel opens a channel on conn.
func channel(t testing.TB, conn *amqp.Connection) *amqp.Channel {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// declareQueue declares a fresh durable queue with args (x-queue-type
// among them), deleted when t ends.
func declareQueue(t *testing.T, ch *amqp.Channel, args amqp.Table) string {
	t.Helper()
	queue := testenv.Name()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
		t.Fatalf("declare %s queue: %v", args["x-queue-type"], err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	return queue
}

// newBenchArgs is newBench with the queue's arguments, x-queue-type
// among them.
func newBenchArgs(t *testing.T, b *inboxtest.Backend, args amqp.Table) *bench {
	t.Helper()
	queueType := args["x-queue-type"].(string)
	url, _, ch := openBroker(t)
	queue := declareQueue(t, ch, args)
	return &bench{t: t, b: b, url: url, ch: ch, queue: queue, queueType: queueType, args: args,
		Tally: inboxtest.NewTally()}
}

func (be *bench) publish(id, body string) {
	be.t.Helper()
	err := be.ch.PublishWithContext(context.Background(), "", be.queue, false, false,
		amqp.Publishing{MessageId: id, Body: []byte(body), DeliveryMode: amqp.Persistent})
	if err != nil {
		be.t.Errorf("publish: %v", err)
	}
}

// instance is one consumer process: its own connection, store and inbox.
type instance struct {
	conn   *amqp.Connection
	inbox  *ideminbox.Inbox
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (be *bench) start(mod func(*ideminbox.Config), cfg *Config, handler HandlerFunc, hook func(*instance, amqp.Delivery, ideminbox.Decision)) *instance {
	t := be.t
	t.Helper()
	conn, err := amqp.Dial(be.url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Qos(16, 0, false); err != nil {
		t.Fatal(err)
	}
	ic := inboxtest.InstanceConfig()
	if mod != nil {
		mod(&ic)
	}
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, be.b.NewStore(t)), &ic)
	if err != nil {
		t.Fatal(err)
	}
	counted := func(ctx context.Context, d amqp.Delivery) error {
		be.Called(d.MessageId)
		return handler(ctx, d)
	}
	in := &instance{conn: conn, inbox: inbox, done: make(chan error, 1)}
	observed := Config{}
	if cfg != nil {
		observed = *cfg
	}
	observed.ObserveFunc = func(d amqp.Delivery, dec ideminbox.Decision, _ error) {
		be.Observed(d.MessageId, dec.Action, Attempt(d))
		if hook != nil {
			hook(in, d, dec)
		}
	}
	c, err := NewConsumer(inbox, counted, &observed)
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(be.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() { in.done <- c.Consume(ctx, deliveries) }()
	be.mu.Lock()
	be.instances = append(be.instances, in)
	be.mu.Unlock()
	t.Cleanup(in.stop)
	return in
}

// stop ends the instance as a clean shutdown would, and closes its
// connection, which returns any unacknowledged delivery to the queue.
func (in *instance) stop() {
	in.once.Do(func() {
		in.cancel()
		<-in.done
		in.conn.Close()
	})
}

// waitFor waits until cond holds, with be.mu held while it runs (for
// what a test keeps there).
func (be *bench) waitFor(what string, cond func() bool) {
	be.t.Helper()
	deadline := time.Now().Add(inboxtest.Patience())
	for !be.locked(cond) {
		if time.Now().After(deadline) {
			be.t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settle waits until cond holds, then stops every instance and checks that
// the queue holds nothing: no message left and none unacknowledged (those
// return to the queue when their connection closes).
func (be *bench) settle(what string, cond func() bool) {
	be.t.Helper()
	be.waitFor(what, cond)
	be.mu.Lock()
	instances := be.instances
	be.mu.Unlock()
	for _, in := range instances {
		in.stop()
	}
	q, err := be.ch.QueueDeclarePassive(be.queue, true, false, false, false, be.args)
	if err != nil {
		be.t.Fatalf("inspect queue: %v", err)
	}
	if q.Messages != 0 {
		be.t.Errorf("%d messages left in the queue", q.Messages)
	}
}

func (be *bench) locked(cond func() bool) bool {
	be.mu.Lock()
	defer be.mu.Unlock()
	return cond()
}

func effect(b *inboxtest.Backend) HandlerFunc {
	return func(ctx context.Context, d amqp.Delivery) error {
		return b.Insert(ctx, inboxtest.Effects, d.MessageId, string(d.Body))
	}
}

// N messages, each published several times at the same instant from
// concurrent publishers, consumed by two competing instances: N effects.
func TestDuplicatesCompetingInstances(t *testing.T) {
	forEach(t, func(t *testing.T, be *bench) {
		n, copies := 40, 3
		if inboxtest.Soak() {
			n, copies = 2000, 4
		}
		ids := inboxtest.OrderIDs(n)
		be.start(nil, nil, effect(be.b), nil)
		be.start(nil, nil, effect(be.b), nil)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for p := range 4 {
			// Channels are not for concurrent publishing: one per publisher.
			conn, err := amqp.Dial(be.url)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ch, err := conn.Channel()
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Publisher p sends its share of the copies, interleaved
				// with the other publishers'.
				for c := range copies {
					for i, k := range ids {
						if (i+c)%4 != p {
							continue
						}
						err := ch.PublishWithContext(context.Background(), "", be.queue, false, false,
							amqp.Publishing{MessageId: k, Body: []byte(fmt.Sprintf("%s copy %d", k, c))})
						if err != nil {
							t.Errorf("publish: %v", err)
						}
					}
				}
			}()
		}
		close(start)
		wg.Wait()
		be.settle("every copy acknowledged", func() bool {
			for _, k := range ids {
				if be.Acked(k) < copies {
					return false
				}
			}
			return true
		})
		inboxtest.ExactlyOnce(t, be.b, ids)
		for _, k := range ids {
			if a, d := be.Count(k, ideminbox.Ack), be.Count(k, ideminbox.AckDuplicate); a != 1 || d != copies-1 {
				t.Errorf("%s: %d acks and %d duplicate acks, want 1 and %d", k, a, d, copies-1)
			}
		}
	})
}

// An instance dies after its commit and before its ack: the broker
// requeues the message to the other instance, which acks it as a duplicate
// without a second effect.
func TestKilledBetweenCommitAndAck(t *testing.T) {
	forEach(t, func(t *testing.T, be *bench) {
		ids := inboxtest.OrderIDs(10)
		for _, k := range ids {
			be.publish(k, k)
		}
		var once sync.Once
		killed := ""
		be.start(nil, nil, effect(be.b), func(in *instance, d amqp.Delivery, dec ideminbox.Decision) {
			if dec.Action == ideminbox.Ack {
				once.Do(func() {
					be.mu.Lock()
					killed = d.MessageId
					be.mu.Unlock()
					in.conn.Close() // the ack that follows cannot reach the broker
				})
			}
		})
		be.waitFor("an instance killed", func() bool { return killed != "" })
		be.start(nil, nil, effect(be.b), nil)
		be.settle("every message acknowledged", func() bool {
			for _, k := range ids {
				if be.Acked(k) == 0 {
					return false
				}
			}
			// The killed delivery came back and was decided again.
			return be.Acked(killed) >= 2
		})
		inboxtest.ExactlyOnce(t, be.b, ids)
		if n := be.Count(killed, ideminbox.AckDuplicate); n != 1 {
			t.Errorf("the redelivery of %s was acked as a duplicate %d times, want 1: %v", killed, n, be.Decisions(killed))
		}
		if be.Calls(killed) != 1 {
			t.Errorf("handler ran %d times for %s", be.Calls(killed), killed)
		}
	})
}

// A handler that fails the first k deliveries of each message (after
// writing its effect, which must roll back) takes effect once.
func TestFailingThenSucceeding(t *testing.T) {
	forEach(t, func(t *testing.T, be *bench) {
		const k = 2
		ids := inboxtest.OrderIDs(10)
		flaky := func(ctx context.Context, d amqp.Delivery) error {
			if err := effect(be.b)(ctx, d); err != nil {
				return err
			}
			calls := be.Calls(d.MessageId)
			if calls <= k {
				return errors.New("transient failure")
			}
			return nil
		}
		be.start(nil, nil, flaky, nil)
		be.start(nil, nil, flaky, nil)
		for _, id := range ids {
			be.publish(id, id)
		}
		be.settle("every message acknowledged", func() bool {
			for _, id := range ids {
				if be.Count(id, ideminbox.Ack) == 0 {
					return false
				}
			}
			return true
		})
		inboxtest.ExactlyOnce(t, be.b, ids)
		for _, id := range ids {
			if be.Calls(id) != k+1 || be.Count(id, ideminbox.Nack) != k {
				t.Errorf("%s: %d runs, %d nacks; want %d, %d", id, be.Calls(id), be.Count(id, ideminbox.Nack), k+1, k)
			}
		}
	})
}

// A handler that always fails: after MaxAttempts deliveries the message is
// recorded as poison, dead-lettered once, acked, and not redelivered. On a
// quorum queue two competing instances share the broker's count; on a
// classic queue the count is per instance, so one instance runs.
func TestPoison(t *testing.T) {
	forEach(t, func(t *testing.T, be *bench) {
		const maxAttempts = 3
		ids := inboxtest.OrderIDs(5)
		failing := func(ctx context.Context, d amqp.Delivery) error {
			if err := effect(be.b)(ctx, d); err != nil {
				return err
			}
			return errors.New("cannot parse order")
		}
		mod := func(c *ideminbox.Config) {
			c.MaxAttempts = maxAttempts
			c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
				return be.b.Insert(ctx, inboxtest.DeadLetters, msg.ID, cause.Error())
			}
		}
		in := be.start(mod, nil, failing, nil)
		if be.queueType == "quorum" {
			be.start(mod, nil, failing, nil)
		}
		for _, id := range ids {
			be.publish(id, "payload of "+id)
		}
		be.settle("every message poisoned", func() bool {
			for _, id := range ids {
				if be.Count(id, ideminbox.AckPoison) == 0 {
					return false
				}
			}
			return true
		})
		if rows := be.b.Rows(t, inboxtest.Effects); len(rows) != 0 {
			t.Errorf("failed handlers left %d effects", len(rows))
		}
		dead := inboxtest.Count(be.b.Rows(t, inboxtest.DeadLetters))
		for _, id := range ids {
			if dead[id] != 1 {
				t.Errorf("%s dead-lettered %d times", id, dead[id])
			}
			if be.Calls(id) != maxAttempts || be.Count(id, ideminbox.AckPoison) != 1 {
				t.Errorf("%s: %d runs, decisions %v", id, be.Calls(id), be.Decisions(id))
			}
			st, err := in.inbox.Status(context.Background(), id)
			if err != nil || st.State != ideminbox.StatePoison || st.Error != "cannot parse order" ||
				string(st.Data) != "payload of "+id || st.Attempt != maxAttempts || st.Subject != be.queue {
				t.Errorf("%s: status %+v, %v", id, st, err)
			}
		}
	})
}

// A delivery without a MessageId is not run: it is rejected with a clear
// error, unless a KeyFunc names it.
func TestMissingMessageID(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, "quorum")
		inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewConsumer(inbox, effect(b), nil)
		if err != nil {
			t.Fatal(err)
		}
		be.publish("", "anonymous")
		dec, err := c.Handle(context.Background(), be.get())
		if dec.Action != ideminbox.Reject || !errors.Is(err, ideminbox.ErrNoMessageID) || !strings.Contains(err.Error(), "MessageId") {
			t.Fatalf("Handle: %v, %v", dec.Action, err)
		}
		if rows := b.Rows(t, inboxtest.Effects); len(rows) != 0 {
			t.Fatalf("a delivery without id ran: %v", rows)
		}

		keyed, err := NewConsumer(inbox, func(ctx context.Context, d amqp.Delivery) error {
			return b.Insert(ctx, inboxtest.Effects, d.Headers["Order-Id"].(string), string(d.Body))
		}, &Config{KeyFunc: func(d amqp.Delivery) (string, error) {
			if v, ok := d.Headers["Order-Id"].(string); ok {
				return v, nil
			}
			return "", errors.New("no Order-Id header")
		}})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := be.ch.PublishWithContext(context.Background(), "", be.queue, false, false,
				amqp.Publishing{Headers: amqp.Table{"Order-Id": "order-7"}, Body: []byte("x")}); err != nil {
				t.Fatal(err)
			}
		}
		var actions []ideminbox.Action
		for range 2 {
			dec, err := keyed.Handle(context.Background(), be.get())
			if err != nil {
				t.Fatal(err)
			}
			actions = append(actions, dec.Action)
		}
		if actions[0] != ideminbox.Ack || actions[1] != ideminbox.AckDuplicate {
			t.Fatalf("decisions %v", actions)
		}
		inboxtest.ExactlyOnce(t, b, []string{"order-7"})
	})
}

// get fetches one message, waiting for a publish to arrive.
func (be *bench) get() amqp.Delivery {
	be.t.Helper()
	var d amqp.Delivery
	be.waitFor("a message to get", func() bool {
		var ok bool
		var err error
		d, ok, err = be.ch.Get(be.queue, false)
		if err != nil {
			be.t.Fatalf("get: %v", err)
		}
		return ok
	})
	return d
}

func TestAttempt(t *testing.T) {
	for _, tc := range []struct {
		headers amqp.Table
		want    int
	}{
		{nil, 0},
		{amqp.Table{DeliveryCountHeader: int64(2)}, 3},
		{amqp.Table{DeliveryCountHeader: int32(0)}, 1},
		{amqp.Table{DeliveryCountHeader: "x"}, 0},
		{amqp.Table{DeliveryCountHeader: int64(-1)}, 0},
	} {
		if got := Attempt(amqp.Delivery{Headers: tc.headers}); got != tc.want {
			t.Errorf("Attempt(%v) = %d, want %d", tc.headers, got, tc.want)
		}
	}
}
