package idemamqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

// The adapter passes the inbox's broker-adapter suite on a real RabbitMQ,
// on both kinds of queue: quorum queues number deliveries, classic ones do
// not (the inbox counts).
func TestConformance(t *testing.T) {
	for _, qt := range queueTypes {
		t.Run(qt, func(t *testing.T) { inboxtest.ExerciseAdapter(t, openDest(qt, "")) })
	}
}

// dest is one queue, deleted at cleanup.
type dest struct {
	url   string
	ch    *amqp.Channel
	queue string
	args  amqp.Table
	bug   string // the planted bug of a mutant, "" for the adapter itself
}

func openDest(queueType, bug string) func(t *testing.T) inboxtest.Destination {
	return func(t *testing.T) inboxtest.Destination {
		url := testenv.AMQPURL(t)
		conn, err := amqp.Dial(url)
		if err != nil {
			testenv.Unavailable(t, "RabbitMQ", err)
		}
		t.Cleanup(func() { conn.Close() })
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		queue := testenv.Name()
		args := amqp.Table{"x-queue-type": queueType}
		if v, _ := conn.Properties["version"].(string); queueType == "quorum" && !strings.HasPrefix(v, "3.") {
			// No delivery limit: RabbitMQ 4 gives a quorum queue 20 (and
			// RabbitMQ 3, which has none, takes -1 for 0).
			args[DeliveryLimitArg] = int64(-1)
		}
		if _, err := ch.QueueDeclare(queue, true, false, false, false, args); err != nil {
			t.Fatalf("declare %s queue: %v", queueType, err)
		}
		t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
		return &dest{url: url, ch: ch, queue: queue, args: args, bug: bug}
	}
}

func (d *dest) Publish(t testing.TB, id string, data []byte) {
	err := d.ch.PublishWithContext(context.Background(), "", d.queue, false, false,
		amqp.Publishing{MessageId: id, Body: data, DeliveryMode: amqp.Persistent})
	if err != nil {
		t.Errorf("publish: %v", err)
	}
}

// Pending counts the messages ready in the queue. RabbitMQ tells no client
// how many are delivered and unacknowledged; the suite stops the consumers
// before its last count, which returns those to the queue.
func (d *dest) Pending(t testing.TB) int {
	q, err := d.ch.QueueDeclarePassive(d.queue, true, false, false, false, d.args)
	if err != nil {
		t.Fatalf("inspect queue: %v", err)
	}
	return q.Messages
}

// consumers returns how many consumers the queue has.
func (d *dest) consumers(t testing.TB) int {
	q, err := d.ch.QueueDeclarePassive(d.queue, true, false, false, false, d.args)
	if err != nil {
		t.Fatalf("inspect queue: %v", err)
	}
	return q.Consumers
}

func (d *dest) Consume(t testing.TB, inbox *ideminbox.Inbox, handler func(ctx context.Context, id string) error) func() {
	conn, err := amqp.Dial(d.url)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	// One unacknowledged delivery per instance: copies of a message then
	// reach competing instances instead of waiting in one's buffer.
	if err := ch.Qos(1, 0, false); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(d.queue, "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, dl amqp.Delivery) error { return handler(ctx, dl.MessageId) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d.bug == "" {
			c, err := NewConsumer(inbox, h, &Config{Logger: quiet})
			if err != nil {
				t.Error(err)
				return
			}
			_ = c.Consume(ctx, deliveries) // ErrClosed once killed
			return
		}
		runMutant(ctx, inbox, deliveries, h, d.bug)
	}()
	var once sync.Once
	kill := func() {
		once.Do(func() {
			before := d.consumers(t)
			conn.Close() // as a crash: the unacknowledged deliveries return to the queue
			cancel()
			// The broker returns them as it drops the consumer, which a quorum
			// queue does after the connection has closed: wait for that, so
			// that a count after kill sees them.
			deadline := time.Now().Add(10 * time.Second)
			for d.consumers(t) >= before && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	t.Cleanup(func() {
		kill()
		<-done
	})
	return kill
}

// mutants are adapters with a planted bug, each with the case of the
// suite that must catch it.
var mutants = map[string]string{
	"ackBeforeCommit":  "FailedHandlerRedelivered", // acknowledges on arrival, before the inbox ran
	"nakAcks":          "FailedHandlerRedelivered", // a failure is acknowledged: the message is lost
	"neverAck":         "Duplicates",               // never releases a processed message
	"keyPerDelivery":   "Duplicates",               // keys on the delivery, not the message: copies differ
	"attemptAlwaysOne": "Poison",                   // reports every delivery as the first
	"termRequeues":     "NoIDRejected",             // gives a message without an id back to run again
}

// mutantDelivery is the adapter's delivery with one bug planted.
type mutantDelivery struct {
	delivery
	bug string
}

func (m mutantDelivery) Message() (ideminbox.Message, error) {
	if m.bug == "ackBeforeCommit" {
		_ = m.Delivery.Ack(false)
	}
	msg, err := m.delivery.Message()
	switch m.bug {
	case "attemptAlwaysOne":
		msg.Attempt = 1
	case "keyPerDelivery":
		var b [8]byte
		_, _ = rand.Read(b[:])
		msg.ID = hex.EncodeToString(b[:])
	}
	return msg, err
}

func (m mutantDelivery) Ack() error {
	if m.bug == "neverAck" {
		return nil
	}
	return m.delivery.Ack()
}

func (m mutantDelivery) Term() error {
	if m.bug == "termRequeues" {
		return m.delivery.Nak(0)
	}
	return m.delivery.Term()
}

func (m mutantDelivery) Nak(delay time.Duration) error {
	if m.bug == "nakAcks" {
		return m.Delivery.Ack(false)
	}
	return m.delivery.Nak(delay)
}

// runMutant consumes as Consumer.Consume does, through the inbox's
// delivery loop, with the bug planted in the deliveries.
func runMutant(ctx context.Context, inbox *ideminbox.Inbox, deliveries <-chan amqp.Delivery, h HandlerFunc, bug string) {
	loop, err := ideminbox.NewLoop(inbox, &ideminbox.LoopConfig[mutantDelivery]{
		Handler: func(ctx context.Context, d mutantDelivery) error { return h(ctx, d.Delivery) },
		Logger:  quiet,
	})
	if err != nil {
		panic(err)
	}
	_ = loop.Consume(ctx, func(ctx context.Context) (mutantDelivery, error) {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return mutantDelivery{}, ErrClosed
			}
			return mutantDelivery{delivery{d, DefaultKey}, bug}, nil
		case <-ctx.Done():
			return mutantDelivery{}, ctx.Err()
		}
	})
}

// mutantEnv names the bug a child process plants.
const mutantEnv = "IDEMAMQP_MUTANT"

// TestConformanceMutants proves the suite can fail: each planted bug must
// make its case fail, on a quorum queue. Each runs in a child test binary,
// since a failing subtest cannot be caught in process.
func TestConformanceMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("in a mutant's child process")
	}
	if testing.Short() {
		t.Skip("skipping the mutants in -short mode: one child process per bug")
	}
	testenv.AMQPURL(t)
	for bug, caught := range mutants {
		t.Run(bug, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformanceMutant$/^"+caught+"$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), mutantEnv+"="+bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed an adapter with bug %s:\n%s", bug, out)
			}
			if !strings.Contains(string(out), "--- FAIL: TestConformanceMutant/"+caught+" ") {
				t.Fatalf("bug %s did not fail %s:\n%s", bug, caught, out)
			}
		})
	}
}

// TestConformanceMutant runs the suite against the adapter with the bug
// mutantEnv names; only TestConformanceMutants runs it.
func TestConformanceMutant(t *testing.T) {
	bug := os.Getenv(mutantEnv)
	if bug == "" {
		t.Skip("run by TestConformanceMutants")
	}
	inboxtest.ExerciseAdapter(t, openDest("quorum", bug))
}
