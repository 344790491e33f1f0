package idemjetstream

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
		ids := inboxtest.OrderIDs(10)
		for _, k := range ids {
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {k}}, k)
		}
		killed := inboxtest.CrashedAfterCommit(t, "TestCrashingConsumerProcess", append(b.Env(), envStream+"="+be.stream.CachedInfo().Config.Name))

		be.start(nil, nil, effect(b), nil)
		be.drained()
		inboxtest.ExactlyOnce(t, b, ids)
		if be.Count(killed, ideminbox.AckDuplicate) != 1 || be.Calls(killed) != 0 {
			t.Errorf("%s, committed by the crashed process: decisions %v, %d runs here; want one duplicate ack and no run",
				killed, be.Decisions(killed), be.Calls(killed))
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
	_, cons := durable(t, testenv.NATSURL(t), os.Getenv(envStream), "projector")
	ctx, cancel := context.WithTimeout(context.Background(), inboxtest.Patience())
	defer cancel()
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(b), &Config{ObserveFunc: func(msg jetstream.Msg, d ideminbox.Decision, err error) {
		if d.Action == ideminbox.Ack {
			k, _ := DefaultKey(msg)
			inboxtest.ExitAfterCommit(k)
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
// handler: no answer, no ack, no rollback): the crash loop ends as poison
// after MaxAttempts+1 crashes (inboxtest.CrashLoop).
func TestCrashLoopEndsAsPoison(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{AckWait: time.Second})
		be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {inboxtest.CrashLoopID}}, inboxtest.CrashLoopData)
		inboxtest.CrashLoop(t, b, "TestCrashLoopConsumerProcess",
			[]string{envStream + "=" + be.stream.CachedInfo().Config.Name}, be.drained)
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
	nc, cons := durable(t, testenv.NATSURL(t), os.Getenv(envStream), "projector")
	ctx, cancel := context.WithTimeout(context.Background(), inboxtest.Patience())
	defer cancel()
	inbox := inboxtest.CrashLoopInbox(t, b)
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
	// An ack is a publish the client buffers: send it before exiting.
	inboxtest.AwaitPoisoned(t, ctx, poisoned, done, stop, nc.Flush)
}
