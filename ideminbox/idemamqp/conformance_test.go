package idemamqp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
		url, conn, ch := openBroker(t)
		args := amqp.Table{"x-queue-type": queueType}
		if v, _ := conn.Properties["version"].(string); queueType == "quorum" && !strings.HasPrefix(v, "3.") {
			// No delivery limit: RabbitMQ 4 gives a quorum queue 20 (and
			// RabbitMQ 3, which has none, takes -1 for 0).
			args[DeliveryLimitArg] = int64(-1)
		}
		queue := declareQueue(t, ch, args)
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

// runMutant consumes as Consumer.Consume does, through the inbox's
// delivery loop, with the bug planted in the deliveries (a delivery's id
// is a random one, for keyPerDelivery).
func runMutant(ctx context.Context, inbox *ideminbox.Inbox, deliveries <-chan amqp.Delivery, h HandlerFunc, bug string) {
	type mutant = inboxtest.Mutant[delivery]
	loop, err := ideminbox.NewLoop(inbox, &ideminbox.LoopConfig[mutant]{
		Handler: func(ctx context.Context, d mutant) error { return h(ctx, d.Delivery.Delivery) },
		Logger:  quiet,
	})
	if err != nil {
		panic(err)
	}
	randomID := func() string {
		var b [8]byte
		_, _ = rand.Read(b[:])
		return hex.EncodeToString(b[:])
	}
	_ = loop.Consume(ctx, func(ctx context.Context) (mutant, error) {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return mutant{}, ErrClosed
			}
			return mutant{Delivery: delivery{d, DefaultKey}, Bug: bug, DeliveryID: randomID}, nil
		case <-ctx.Done():
			return mutant{}, ctx.Err()
		}
	})
}

// mutantEnv names the bug a child process plants.
const mutantEnv = "IDEMAMQP_MUTANT"

// TestConformanceMutants proves the suite can fail: each planted bug of
// inboxtest.Mutants must make its case fail, on a quorum queue.
func TestConformanceMutants(t *testing.T) {
	testenv.AMQPURL(t)
	inboxtest.ExerciseMutants(t, mutantEnv)
}

// TestConformanceMutant runs the suite against the adapter with the bug
// mutantEnv names; only TestConformanceMutants runs it.
func TestConformanceMutant(t *testing.T) {
	inboxtest.ExerciseAdapter(t, openDest("quorum", inboxtest.MutantBug(t, mutantEnv)))
}
