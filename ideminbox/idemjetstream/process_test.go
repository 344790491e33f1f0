package idemjetstream

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
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
	inbox, err := ideminbox.New(ideminbox.Config{Store: b.NewStore(t), Consumer: "projector", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(inbox, effect(b), &Config{ObserveFunc: func(msg jetstream.Msg, d ideminbox.Decision, err error) {
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
