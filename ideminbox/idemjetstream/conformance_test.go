package idemjetstream

import (
	"context"
	"strconv"
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
		url, js, stream, subject := openStream(t, "orders")
		ctx := context.Background()
		name := stream.CachedInfo().Config.Name
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
	nc, cons := durable(t, d.url, d.stream, "conformance")
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

// runMutant consumes as Consumer.Consume does, through the inbox's
// delivery loop, with the bug planted in the deliveries (a delivery's id
// is its stream sequence, for keyPerDelivery).
func runMutant(ctx context.Context, inbox *ideminbox.Inbox, cons jetstream.Consumer, h HandlerFunc, bug string) {
	type mutant = inboxtest.Mutant[delivery]
	loop, err := ideminbox.NewLoop(inbox, &ideminbox.LoopConfig[mutant]{
		Handler:          func(ctx context.Context, d mutant) error { return h(ctx, d.Delivery.msg) },
		DelaysNak:        true,
		ProgressInterval: 300 * time.Millisecond,
		Logger:           quiet,
	})
	if err != nil {
		panic(err)
	}
	_ = loop.Consume(ctx, func(ctx context.Context) (mutant, error) {
		msg, err := fetch(ctx, cons)
		return mutant{Delivery: delivery{msg, conformanceKey}, Bug: bug, DeliveryID: func() string {
			md, _ := msg.Metadata()
			return strconv.FormatUint(md.Sequence.Stream, 10)
		}}, err
	})
}

// mutantEnv names the bug a child process plants.
const mutantEnv = "IDEMJETSTREAM_MUTANT"

// TestConformanceMutants proves the suite can fail: each planted bug of
// inboxtest.Mutants must make its case fail.
func TestConformanceMutants(t *testing.T) {
	testenv.NATSURL(t)
	inboxtest.ExerciseMutants(t, mutantEnv)
}

// TestConformanceMutant runs the suite against the adapter with the bug
// mutantEnv names; only TestConformanceMutants runs it.
func TestConformanceMutant(t *testing.T) {
	inboxtest.ExerciseAdapter(t, openDest(inboxtest.MutantBug(t, mutantEnv)))
}
