package idemamqp

import (
	"context"
	"os"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

const envQueue = "IDEMINBOX_TEST_QUEUE"

// A consumer process exits (os.Exit, no clean-up, its TCP connection just
// drops) right after a commit, before the ack. RabbitMQ requeues the
// delivery; a consumer in another process, on the same database,
// recognises it: one effect.
func TestProcessKilledBetweenCommitAndAck(t *testing.T) {
	forEach(t, func(t *testing.T, be *bench) {
		ids := inboxtest.OrderIDs(10)
		for _, k := range ids {
			be.publish(k, k)
		}
		killed := inboxtest.CrashedAfterCommit(t, "TestCrashingConsumerProcess", append(be.b.Env(), envQueue+"="+be.queue))

		be.start(nil, nil, effect(be.b), nil)
		be.settle("every message acknowledged", func() bool {
			for _, k := range ids {
				if be.Acked(k) == 0 {
					return false
				}
			}
			return true
		})
		inboxtest.ExactlyOnce(t, be.b, ids)
		if be.Count(killed, ideminbox.AckDuplicate) != 1 || be.Calls(killed) != 0 {
			t.Errorf("%s, committed by the crashed process: decisions %v, %d runs here; want one duplicate ack and no run",
				killed, be.Decisions(killed), be.Calls(killed))
		}
	})
}

// TestCrashingConsumerProcess is the consumer process of
// TestProcessKilledBetweenCommitAndAck, which starts it with the
// environment naming its database and queue. It exits with status 3 after
// its first commit, before the ack.
func TestCrashingConsumerProcess(t *testing.T) {
	b := inboxtest.FromEnv(t)
	if b == nil {
		t.Skip("started by TestProcessKilledBetweenCommitAndAck only")
	}
	_, deliveries := childDeliveries(t)
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(b), &Config{ObserveFunc: func(d amqp.Delivery, dec ideminbox.Decision, err error) {
		if dec.Action == ideminbox.Ack {
			inboxtest.ExitAfterCommit(d.MessageId)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), inboxtest.Patience())
	defer cancel()
	t.Fatalf("no message committed: %v", c.Consume(ctx, deliveries))
}

// childDeliveries consumes, in a consumer process, the queue its parent
// named in the environment, on a connection of its own.
func childDeliveries(t *testing.T) (*amqp.Connection, <-chan amqp.Delivery) {
	t.Helper()
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := channel(t, conn).Consume(os.Getenv(envQueue), "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conn, deliveries
}

// A message kills its consumer process every time (os.Exit inside the
// handler): on a quorum queue, which counts each delivery, the crash loop
// ends as poison after MaxAttempts+1 crashes (inboxtest.CrashLoop).
func TestCrashLoopEndsAsPoison(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, "quorum")
		be.publish(inboxtest.CrashLoopID, inboxtest.CrashLoopData)
		inboxtest.CrashLoop(t, b, "TestCrashLoopConsumerProcess", []string{envQueue + "=" + be.queue},
			func() { be.settle("nothing left", func() bool { return true }) })
	})
}

// TestCrashLoopConsumerProcess is a consumer process of
// TestCrashLoopEndsAsPoison: its handler exits the process (status 3);
// once the inbox records the message as poison instead, it acks it, says
// so and returns.
func TestCrashLoopConsumerProcess(t *testing.T) {
	b := inboxtest.FromEnv(t)
	if b == nil {
		t.Skip("started by TestCrashLoopEndsAsPoison only")
	}
	conn, deliveries := childDeliveries(t)
	inbox := inboxtest.CrashLoopInbox(t, b)
	poisoned := make(chan string, 1)
	c, err := NewConsumer(inbox, func(ctx context.Context, d amqp.Delivery) error {
		os.Exit(3)
		return nil
	}, &Config{ObserveFunc: func(d amqp.Delivery, dec ideminbox.Decision, err error) {
		if dec.Action == ideminbox.AckPoison {
			poisoned <- d.MessageId
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), inboxtest.Patience())
	defer cancel()
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Consume(consumeCtx, deliveries) }()
	// Closing the connection sends what the client still holds.
	inboxtest.AwaitPoisoned(t, ctx, poisoned, done, stop, conn.Close)
}
