package idemjetstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

const envStream = "IDEMINBOX_TEST_STREAM"

// A consumer process exits (os.Exit, no clean-up, its connection just
// drops) right after a commit, before the ack. After AckWait the server
// redelivers; a consumer in another process, on the same database,
// recognises the message: one effect.
func TestProcessKilledBetweenCommitAndAck(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{AckWait: time.Second})
		ids := orderIDs(10)
		for _, k := range ids {
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {k}}, k)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestCrashingConsumerProcess$", "-test.count=1")
		cmd.Env = append(append(os.Environ(), b.Env()...), envStream+"="+be.stream.CachedInfo().Config.Name)
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

		be.start(nil, nil, effect(b), nil)
		be.drained()
		exactlyOnce(t, b, ids)
		if be.actions(killed, ideminbox.AckDuplicate) != 1 || be.callsOf(killed) != 0 {
			t.Errorf("%s, committed by the crashed process: decisions %v, %d runs here; want one duplicate ack and no run",
				killed, be.decisionsOf(killed), be.callsOf(killed))
		}
	})
}

// TestCrashingConsumerProcess is the consumer process of
// TestProcessKilledBetweenCommitAndAck, which starts it with the
// environment naming its database and stream. It exits with status 3
// after its first commit, before the ack.
func TestCrashingConsumerProcess(t *testing.T) {
	b := inboxtest.FromEnv(t)
	if b == nil {
		t.Skip("started by TestProcessKilledBetweenCommitAndAck only")
	}
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience())
	defer cancel()
	cons, err := js.Consumer(ctx, os.Getenv(envStream), "projector")
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(b), &Config{ObserveFunc: func(msg jetstream.Msg, d ideminbox.Decision, err error) {
		if d.Action == ideminbox.Ack {
			k, _ := DefaultKey(msg)
			fmt.Printf("crashed after committing %s\n", k)
			os.Exit(3)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Consume(ctx, cons); err != nil {
		t.Fatal(err)
	}
	t.Fatal("no message committed")
}

// A message kills its consumer process every time (os.Exit inside the
// handler: no answer, no ack, no rollback). Started again after each
// crash, the consumer gets the message back each time. The first
// delivery past MaxAttempts finds its key still held by the dead
// process's claim, and grants it a last run, which crashes too; the next
// delivery finds the key held by that last run's claim, records the
// message as poison without running it again, and acks it: the crash loop
// ends, after MaxAttempts+1 crashes.
func TestCrashLoopEndsAsPoison(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{AckWait: time.Second})
		be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {"order-deadly"}}, "deadly")
		crashes := 0
		// transcript keeps what each consumer process saw (its deliveries
		// and the inbox's answers), for a failure to show the sequence.
		var transcript strings.Builder
		for child := 1; ; child++ {
			if child > crashLoopMaxAttempts+3 {
				t.Fatalf("still crashing after %d consumer processes:\n%s", child-1, transcript.String())
			}
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashLoopConsumerProcess$", "-test.count=1")
			cmd.Env = append(append(os.Environ(), b.Env()...), envStream+"="+be.stream.CachedInfo().Config.Name)
			out, err := cmd.CombinedOutput()
			fmt.Fprintf(&transcript, "consumer process %d (%v):\n%s", child, err, out)
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
		be.drained()
		inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		st, err := inbox.Status(context.Background(), "order-deadly")
		if err != nil || st.State != ideminbox.StatePoison || st.Error != ideminbox.ErrUnanswered.Error() ||
			st.Attempt != crashLoopMaxAttempts+2 || string(st.Data) != "deadly" || crashes != crashLoopMaxAttempts+1 {
			t.Fatalf("after %d crashes: status %+v, %v; want poison, unanswered, on delivery %d after %d crashes\n%s",
				crashes, st, err, crashLoopMaxAttempts+2, crashLoopMaxAttempts+1, transcript.String())
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
	nc, err := nats.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience())
	defer cancel()
	cons, err := js.Consumer(ctx, os.Getenv(envStream), "projector")
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
	delivery := func(msg jetstream.Msg) uint64 {
		md, _ := msg.Metadata()
		return md.NumDelivered
	}
	c, err := NewConsumer(inbox, func(ctx context.Context, msg jetstream.Msg) error {
		fmt.Printf("%s delivery %d: running\n", time.Now().Format("15:04:05.000"), delivery(msg))
		os.Exit(3)
		return nil
	}, &Config{ObserveFunc: func(msg jetstream.Msg, d ideminbox.Decision, err error) {
		fmt.Printf("%s delivery %d: %v %v\n", time.Now().Format("15:04:05.000"), delivery(msg), d.Action, err)
		if d.Action == ideminbox.AckPoison {
			k, _ := DefaultKey(msg)
			poisoned <- k
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	consumeCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Consume(consumeCtx, cons) }()
	select {
	case k := <-poisoned:
		stop() // Consume acks the message in hand, then returns
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		// An ack is a publish the client buffers: send it before exiting.
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		fmt.Printf("poisoned %s\n", k)
	case err := <-done:
		t.Fatalf("Consume: %v", err)
	case <-ctx.Done():
		t.Fatal("no message")
	}
}
