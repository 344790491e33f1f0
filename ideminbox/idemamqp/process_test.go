package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
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
		ids := orderIDs(10)
		for _, k := range ids {
			be.publish(k, k)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashingConsumerProcess$", "-test.count=1")
		cmd.Env = append(append(os.Environ(), be.b.Env()...), envQueue+"="+be.queue)
		out, err := cmd.Output()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("the consumer process did not crash as planned: %v\n%s", err, out)
		}
		m := regexp.MustCompile(`(?m)^crashed after committing (\S+)$`).FindSubmatch(out)
		if m == nil {
			t.Fatalf("the consumer process did not say what it committed:\n%s", out)
		}
		killed := string(m[1])

		be.start(nil, nil, effect(be.b), nil)
		be.settle("every message acknowledged", func() bool {
			for _, k := range ids {
				if be.count(k, ideminbox.Ack)+be.count(k, ideminbox.AckDuplicate) == 0 {
					return false
				}
			}
			return true
		})
		exactlyOnce(t, be.b, ids)
		if be.count(killed, ideminbox.AckDuplicate) != 1 || be.calls[killed] != 0 {
			t.Errorf("%s, committed by the crashed process: decisions %v, %d runs here; want one duplicate ack and no run",
				killed, be.decisions[killed], be.calls[killed])
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
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(os.Getenv(envQueue), "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(b), &Config{ObserveFunc: func(d amqp.Delivery, dec ideminbox.Decision, err error) {
		if dec.Action == ideminbox.Ack {
			fmt.Printf("crashed after committing %s\n", d.MessageId)
			os.Exit(3)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience())
	defer cancel()
	t.Fatalf("no message committed: %v", c.Consume(ctx, deliveries))
}

// A message kills its consumer process every time (os.Exit inside the
// handler). Started again after each crash, the consumer gets the message
// back each time (the quorum queue counting one more delivery). The first
// delivery past MaxAttempts finds its key still held by the dead
// process's claim, and grants it a last run, which crashes too; the next
// delivery finds the key held by that last run's claim, records the
// message as poison without running it again, and acks it: the crash loop
// ends, after MaxAttempts+1 crashes.
func TestCrashLoopEndsAsPoison(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, "quorum")
		be.publish("order-deadly", "deadly")
		crashes := 0
		for child := 1; ; child++ {
			if child > crashLoopMaxAttempts+3 {
				t.Fatalf("still crashing after %d consumer processes", child-1)
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopConsumerProcess$", "-test.count=1")
			cmd.Env = append(append(os.Environ(), b.Env()...), envQueue+"="+be.queue)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if errors.As(err, &exit) && exit.ExitCode() == 3 {
				crashes++
				continue
			}
			if err != nil || !regexp.MustCompile(`(?m)^poisoned order-deadly$`).Match(out) {
				t.Fatalf("consumer process %d: %v\n%s", child, err, out)
			}
			break
		}
		be.settle("nothing left", func() bool { return true })
		inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		st, err := inbox.Status(context.Background(), "order-deadly")
		if err != nil || st.State != ideminbox.StatePoison || st.Error != ideminbox.ErrUnanswered.Error() ||
			st.Attempt != crashLoopMaxAttempts+2 || string(st.Data) != "deadly" || crashes != crashLoopMaxAttempts+1 {
			t.Fatalf("after %d crashes: status %+v, %v; want poison, unanswered, on delivery %d after %d crashes",
				crashes, st, err, crashLoopMaxAttempts+2, crashLoopMaxAttempts+1)
		}
	})
}

const crashLoopMaxAttempts = 3

// TestCrashLoopConsumerProcess is a consumer process of
// TestCrashLoopEndsAsPoison: its handler exits the process (status 3);
// once the inbox records the message as poison instead, it acks it, says
// so and returns.
func TestCrashLoopConsumerProcess(t *testing.T) {
	b := inboxtest.FromEnv(t)
	if b == nil {
		t.Skip("started by TestCrashLoopEndsAsPoison only")
	}
	conn, err := amqp.Dial(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(os.Getenv(envQueue), "", false, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := idem.NewEngine(b.NewStore(t), &idem.Config{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "projector", Logger: quiet,
		MaxAttempts: crashLoopMaxAttempts, InFlightDelay: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
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
	ctx, cancel := context.WithTimeout(context.Background(), patience())
	defer cancel()
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Consume(consumeCtx, deliveries) }()
	select {
	case k := <-poisoned:
		stop() // Consume acks the delivery in hand, then returns
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// Closing the connection sends what the client still holds.
		if err := conn.Close(); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("poisoned %s\n", k)
	case err := <-done:
		t.Fatalf("Consume: %v", err)
	case <-ctx.Done():
		t.Fatal("no message")
	}
}
