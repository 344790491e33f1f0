package idemjetstream

import (
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

// The adapter passes the inbox's broker-adapter suite on a real JetStream
// server.
func TestConformance(t *testing.T) {
	inboxtest.ExerciseAdapter(t, openDest(""))
}

// idHeader carries the suite's message ids. Not Nats-Msg-Id: the server
// would drop the copies the suite publishes on purpose.
const idHeader = "Conformance-Id"

// dest is a stream and its durable consumer, deleted at cleanup.
type dest struct {
	url      string
	js       jetstream.JetStream
	stream   string
	subject  string
	consumer jetstream.Consumer
	bug      string // the planted bug of a mutant, "" for the adapter itself
}

func openDest(bug string) func(t *testing.T) inboxtest.Destination {
	return func(t *testing.T) inboxtest.Destination {
		url := testenv.NATSURL(t)
		nc, err := nats.Connect(url)
		if err != nil {
			testenv.Unavailable(t, "NATS", err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		name := testenv.Name()
		subject := strings.ReplaceAll(name, "_", ".") + ".orders"
		stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
		if err != nil {
			testenv.Unavailable(t, "NATS JetStream", err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
		// A short AckWait: a killed instance's message comes back soon.
		cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "conformance", MaxDeliver: -1, AckWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return &dest{url: url, js: js, stream: name, subject: subject, consumer: cons, bug: bug}
	}
}

func (d *dest) Publish(t testing.TB, id string, data []byte) {
	if _, err := d.js.PublishMsg(context.Background(), &nats.Msg{Subject: d.subject, Header: nats.Header{idHeader: {id}}, Data: data}); err != nil {
		t.Errorf("publish: %v", err)
	}
}

func (d *dest) Pending(t testing.TB) int {
	info, err := d.consumer.Info(context.Background())
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	return int(info.NumPending) + info.NumAckPending
}

func conformanceKey(msg jetstream.Msg) (string, error) {
	return msg.Headers().Get(idHeader), nil
}

func (d *dest) Consume(t testing.TB, inbox *ideminbox.Inbox, handler func(ctx context.Context, id string) error) func() {
	nc, err := nats.Connect(d.url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(context.Background(), d.stream, "conformance")
	if err != nil {
		t.Fatal(err)
	}
	h := func(ctx context.Context, msg jetstream.Msg) error { return handler(ctx, msg.Headers().Get(idHeader)) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if d.bug == "" {
			c, err := NewConsumer(inbox, h, &Config{KeyFunc: conformanceKey, Logger: quiet})
			if err != nil {
				t.Error(err)
				return
			}
			_ = c.Consume(ctx, cons) // ErrClosed once killed
			return
		}
		runMutant(ctx, inbox, cons, h, d.bug)
	}()
	kill := func() {
		nc.Close() // as a crash: nothing more is settled
		cancel()
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
	"keyPerDelivery":   "Duplicates",               // keys on the stream sequence: copies differ
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
		_ = m.msg.Ack()
	}
	msg, err := m.delivery.Message()
	switch m.bug {
	case "attemptAlwaysOne":
		msg.Attempt = 1
	case "keyPerDelivery":
		md, _ := m.msg.Metadata()
		msg.ID = strconv.FormatUint(md.Sequence.Stream, 10)
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
		return m.msg.Ack()
	}
	return m.delivery.Nak(delay)
}

// runMutant consumes as Consumer.Consume does, through the inbox's
// delivery loop, with the bug planted in the deliveries.
func runMutant(ctx context.Context, inbox *ideminbox.Inbox, cons jetstream.Consumer, h HandlerFunc, bug string) {
	loop, err := ideminbox.NewLoop(inbox, &ideminbox.LoopConfig[mutantDelivery]{
		Handler:          func(ctx context.Context, d mutantDelivery) error { return h(ctx, d.msg) },
		DelaysNak:        true,
		ProgressInterval: 300 * time.Millisecond,
		Logger:           quiet,
	})
	if err != nil {
		panic(err)
	}
	_ = loop.Consume(ctx, func(ctx context.Context) (mutantDelivery, error) {
		msg, err := fetch(ctx, cons)
		return mutantDelivery{delivery{msg, conformanceKey}, bug}, err
	})
}

// mutantEnv names the bug a child process plants.
const mutantEnv = "IDEMJETSTREAM_MUTANT"

// TestConformanceMutants proves the suite can fail: each planted bug must
// make its case fail. Each runs in a child test binary, since a failing
// subtest cannot be caught in process.
func TestConformanceMutants(t *testing.T) {
	if os.Getenv(mutantEnv) != "" {
		t.Skip("in a mutant's child process")
	}
	if testing.Short() {
		t.Skip("skipping the mutants in -short mode: one child process per bug")
	}
	testenv.NATSURL(t)
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
	inboxtest.ExerciseAdapter(t, openDest(bug))
}
