package idemjetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

// bench is one stream and durable consumer on the real server, deleted at
// cleanup, and the decisions every instance took.
type bench struct {
	t        *testing.T
	b        *inboxtest.Backend
	url      string
	js       jetstream.JetStream
	stream   jetstream.Stream
	subject  string
	consumer jetstream.Consumer

	*inboxtest.Tally // by message id; a delivery's number is NumDelivered

	mu sync.Mutex // for what a test keeps
}

// openStream connects to the shared NATS server (skipping t when there is
// none, as testenv.Unavailable says) and creates a fresh stream on the
// subject NAME.topic, deleted when t ends.
func openStream(t *testing.T, topic string) (url string, js jetstream.JetStream, stream jetstream.Stream, subject string) {
	t.Helper()
	url = testenv.NATSURL(t)
	nc, err := nats.Connect(url)
	if err != nil {
		testenv.Unavailable(t, "NATS", err)
	}
	t.Cleanup(nc.Close)
	js, err = jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	name := testenv.Name()
	subject = strings.ReplaceAll(name, "_", ".") + "." + topic
	stream, err = js.CreateStream(context.Background(), jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
	if err != nil {
		testenv.Unavailable(t, "NATS JetStream", err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	return url, js, stream, subject
}

// durable connects to url on a connection of its own and returns the
// stream's durable consumer.
func durable(t testing.TB, url, stream, name string) (*nats.Conn, jetstream.Consumer) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(context.Background(), stream, name)
	if err != nil {
		t.Fatal(err)
	}
	return nc, cons
}

func newBench(t *testing.T, b *inboxtest.Backend, cc jetstream.ConsumerConfig) *bench {
	t.Helper()
	url, js, stream, subject := openStream(t, "order.created")
	ctx := context.Background()
	cc.Durable = "projector" // AckPolicy: its zero value is explicit
	if cc.MaxDeliver == 0 {
		cc.MaxDeliver = -1
	}
	consumer, err := stream.CreateConsumer(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	return &bench{t: t, b: b, url: url, js: js, stream: stream, subject: subject, consumer: consumer,
		Tally: inboxtest.NewTally()}
}

// quiet drops the logs of the many failures the tests cause on purpose.
var quiet = inboxtest.Quiet

// eventually waits until cond holds, within inboxtest.Patience.
var eventually = inboxtest.Eventually

// id is the message id the tests use: the Order-Id header where the test
// keys on it, else the adapter's default key.
func id(msg jetstream.Msg) (string, error) {
	if v := msg.Headers().Get("Order-Id"); v != "" {
		return v, nil
	}
	return DefaultKey(msg)
}

func (be *bench) publish(ctx context.Context, header nats.Header, data string) {
	be.t.Helper()
	if _, err := be.js.PublishMsg(ctx, &nats.Msg{Subject: be.subject, Header: header, Data: []byte(data)}); err != nil {
		be.t.Errorf("publish: %v", err)
	}
}

// instance is one consumer process: its own connection, store and inbox.
type instance struct {
	nc     *nats.Conn
	inbox  *ideminbox.Inbox
	c      *Consumer
	cancel context.CancelFunc
	done   chan error
	// killed is set by a test that closes nc itself: Consume then ends
	// with ErrClosed, as it should.
	killed atomic.Bool
}

func (be *bench) start(mod func(*ideminbox.Config), cfg *Config, handler HandlerFunc, hook func(*instance, jetstream.Msg, ideminbox.Decision)) *instance {
	t := be.t
	t.Helper()
	nc, cons := durable(t, be.url, be.stream.CachedInfo().Config.Name, "projector")
	t.Cleanup(nc.Close)
	ic := inboxtest.InstanceConfig()
	if mod != nil {
		mod(&ic)
	}
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, be.b.NewStore(t)), &ic)
	if err != nil {
		t.Fatal(err)
	}
	counted := func(ctx context.Context, msg jetstream.Msg) error {
		k, _ := id(msg)
		be.Called(k)
		return handler(ctx, msg)
	}
	in := &instance{nc: nc, inbox: inbox, done: make(chan error, 1)}
	observed := Config{}
	if cfg != nil {
		observed = *cfg
	}
	observed.ObserveFunc = func(msg jetstream.Msg, d ideminbox.Decision, _ error) {
		k, _ := id(msg)
		md, _ := msg.Metadata()
		be.Observed(k, d.Action, int(md.NumDelivered))
		if hook != nil {
			hook(in, msg, d)
		}
	}
	c, err := NewConsumer(inbox, counted, &observed)
	if err != nil {
		t.Fatal(err)
	}
	in.c = c
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() { in.done <- c.Consume(ctx, cons) }()
	t.Cleanup(func() {
		cancel()
		if err := <-in.done; err != nil && !(in.killed.Load() && errors.Is(err, ErrClosed)) {
			t.Errorf("Consume: %v", err)
		}
	})
	return in
}

// drained waits until the consumer has nothing left to deliver and nothing
// unacknowledged.
func (be *bench) drained() {
	be.t.Helper()
	eventually(be.t, "every message acknowledged", func() bool {
		info, err := be.consumer.Info(context.Background())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.NumWaiting >= 0
	})
}

func effect(b *inboxtest.Backend) HandlerFunc {
	return func(ctx context.Context, msg jetstream.Msg) error {
		k, err := id(msg)
		if err != nil {
			return err
		}
		return b.Insert(ctx, inboxtest.Effects, k, string(msg.Data()))
	}
}

// N messages, each published several times at the same instant from
// concurrent publishers, consumed by two competing instances: N effects.
func TestDuplicatesCompetingInstances(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{})
		n, copies := 40, 3
		if inboxtest.Soak() {
			n, copies = 2000, 4
		}
		ids := inboxtest.OrderIDs(n)
		keyed := &Config{KeyFunc: id}
		be.start(nil, keyed, effect(b), nil)
		be.start(nil, keyed, effect(b), nil)

		// The stream's own dedup (Nats-Msg-Id) would drop these copies at
		// publish; keying on a header of our own lets them all through, as
		// copies published after the stream's window would be.
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, k := range ids {
			for c := range copies {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					be.publish(context.Background(), nats.Header{"Order-Id": {k}}, fmt.Sprintf("%s copy %d", k, c))
				}()
			}
		}
		close(start)
		wg.Wait()
		if info, err := be.stream.Info(context.Background()); err != nil || info.State.Msgs != uint64(n*copies) {
			t.Fatalf("stream holds %v messages (%v), want %d", info.State.Msgs, err, n*copies)
		}
		be.drained()
		inboxtest.ExactlyOnce(t, b, ids)
		for _, k := range ids {
			if a, d := be.Count(k, ideminbox.Ack), be.Count(k, ideminbox.AckDuplicate); a != 1 || d != copies-1 {
				t.Errorf("%s: %d acks and %d duplicate acks, want 1 and %d", k, a, d, copies-1)
			}
		}
	})
}

// An instance dies after its commit and before its ack: the server
// redelivers the message to the other instance, which acks it as a
// duplicate without a second effect.
func TestKilledBetweenCommitAndAck(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{AckWait: time.Second})
		ids := inboxtest.OrderIDs(10)
		for _, k := range ids {
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {k}}, k)
		}
		var once sync.Once
		killed := ""
		be.start(nil, nil, effect(b), func(in *instance, msg jetstream.Msg, d ideminbox.Decision) {
			if d.Action == ideminbox.Ack {
				once.Do(func() {
					k, _ := id(msg)
					be.mu.Lock()
					killed = k
					be.mu.Unlock()
					in.killed.Store(true)
					in.nc.Close() // the ack that follows cannot reach the server
				})
			}
		})
		eventually(t, "an instance killed", func() bool {
			be.mu.Lock()
			defer be.mu.Unlock()
			return killed != ""
		})
		be.start(nil, nil, effect(b), nil)
		be.drained()
		inboxtest.ExactlyOnce(t, b, ids)
		be.mu.Lock()
		k := killed
		be.mu.Unlock()
		if be.Count(k, ideminbox.AckDuplicate) < 1 {
			t.Errorf("the redelivery of %s was not acked as a duplicate: %v", k, be.Decisions(k))
		}
		if n := be.Calls(k); n != 1 {
			t.Errorf("handler ran %d times for %s", n, k)
		}
	})
}

// A handler that fails the first k deliveries of each message (after
// writing its effect, which must roll back) takes effect once.
func TestFailingThenSucceeding(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{})
		const k = 2
		ids := inboxtest.OrderIDs(10)
		flaky := func(ctx context.Context, msg jetstream.Msg) error {
			if err := effect(b)(ctx, msg); err != nil {
				return err
			}
			if md, _ := msg.Metadata(); md.NumDelivered <= k {
				return errors.New("transient failure")
			}
			return nil
		}
		be.start(nil, nil, flaky, nil)
		be.start(nil, nil, flaky, nil)
		for _, id := range ids {
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {id}}, id)
		}
		be.drained()
		inboxtest.ExactlyOnce(t, b, ids)
		for _, id := range ids {
			if be.Calls(id) != k+1 || be.Count(id, ideminbox.Nack) != k {
				t.Errorf("%s: %d runs, %d nacks; want %d, %d", id, be.Calls(id), be.Count(id, ideminbox.Nack), k+1, k)
			}
		}
	})
}

// A handler that always fails: after MaxAttempts deliveries the message is
// recorded as poison, dead-lettered once, acked, and not redelivered.
func TestPoison(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{})
		const maxAttempts = 3
		ids := inboxtest.OrderIDs(5)
		failing := func(ctx context.Context, msg jetstream.Msg) error {
			if err := effect(b)(ctx, msg); err != nil {
				return err
			}
			return errors.New("cannot parse order")
		}
		mod := func(c *ideminbox.Config) {
			c.MaxAttempts = maxAttempts
			c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
				return b.Insert(ctx, inboxtest.DeadLetters, msg.ID, cause.Error())
			}
		}
		in := be.start(mod, nil, failing, nil)
		be.start(mod, nil, failing, nil)
		for _, id := range ids {
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {id}}, "payload of "+id)
		}
		be.drained()
		if rows := b.Rows(t, inboxtest.Effects); len(rows) != 0 {
			t.Errorf("failed handlers left %d effects", len(rows))
		}
		dead := inboxtest.Count(b.Rows(t, inboxtest.DeadLetters))
		for _, id := range ids {
			if dead[id] != 1 {
				t.Errorf("%s dead-lettered %d times", id, dead[id])
			}
			if be.Calls(id) != maxAttempts || be.Count(id, ideminbox.AckPoison) != 1 {
				t.Errorf("%s: %d runs, decisions %v", id, be.Calls(id), be.Decisions(id))
			}
			st, err := in.inbox.Status(context.Background(), id)
			if err != nil || st.State != ideminbox.StatePoison || st.Error != "cannot parse order" ||
				string(st.Data) != "payload of "+id || st.Attempt != maxAttempts {
				t.Errorf("%s: status %+v, %v", id, st, err)
			}
		}
	})
}

// Without a Nats-Msg-Id the key is the stream, sequence and storage time,
// which protects against redelivery; with it, copies published after the
// stream's duplicate window are recognised too.
func TestDefaultKey(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		be := newBench(t, b, jetstream.ConsumerConfig{})
		if _, err := be.js.UpdateStream(context.Background(), jetstream.StreamConfig{
			Name: be.stream.CachedInfo().Config.Name, Subjects: []string{be.subject}, Duplicates: 100 * time.Millisecond,
		}); err != nil {
			t.Fatal(err)
		}
		// Fail each first delivery so that every message is redelivered.
		redelivered := func(ctx context.Context, msg jetstream.Msg) error {
			if err := effect(b)(ctx, msg); err != nil {
				return err
			}
			if md, _ := msg.Metadata(); md.NumDelivered == 1 {
				return errors.New("first delivery fails")
			}
			return nil
		}
		in := be.start(nil, nil, redelivered, nil)
		ctx := context.Background()
		be.publish(ctx, nil, "no id 1")
		be.publish(ctx, nil, "no id 2")
		be.publish(ctx, nats.Header{nats.MsgIdHdr: {"order-1"}}, "order-1 copy 1")
		// Past the duplicate window, so that the server stores the copy.
		time.Sleep(300 * time.Millisecond)
		be.publish(ctx, nats.Header{nats.MsgIdHdr: {"order-1"}}, "order-1 copy 2")
		if info, err := be.stream.Info(ctx); err != nil || info.State.Msgs != 4 {
			t.Fatalf("stream holds %v messages (%v), want 4", info.State.Msgs, err)
		}
		be.drained()
		name := be.stream.CachedInfo().Config.Name
		var keys []string
		for seq := uint64(1); seq <= 2; seq++ {
			raw, err := be.stream.GetMsg(ctx, seq)
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, fmt.Sprintf("%s:%d:%d", name, seq, raw.Time.UnixNano()))
		}
		inboxtest.ExactlyOnce(t, b, append(keys, "order-1"))
		for _, k := range []string{keys[0], "order-1"} {
			if st, err := in.inbox.Status(ctx, k); err != nil || st.State != ideminbox.StateProcessed {
				t.Errorf("%s: %+v, %v", k, st, err)
			}
		}
	})
}

// A consumer whose MaxDeliver would drop failing messages before the inbox
// records them as poison is refused.
func TestConsumeRefusesLowMaxDeliver(t *testing.T) {
	b := inboxtest.Mem(t)
	be := newBench(t, b, jetstream.ConsumerConfig{MaxDeliver: 3})
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", MaxAttempts: 3})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Consume(context.Background(), be.consumer)
	if err == nil || !strings.Contains(err.Error(), "MaxDeliver 3") {
		t.Fatalf("Consume: %v", err)
	}
}

// Consume returns ErrClosed, instead of blocking forever, when the
// consumption ends under it: the consumer deleted, the connection closed.
func TestConsumeReturnsWhenClosed(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		for _, end := range []string{"consumer deleted", "connection closed"} {
			t.Run(end, func(t *testing.T) {
				be := newBench(t, b, jetstream.ConsumerConfig{})
				inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
				if err != nil {
					t.Fatal(err)
				}
				c, err := NewConsumer(inbox, effect(b), nil)
				if err != nil {
					t.Fatal(err)
				}
				nc, cons := durable(t, be.url, be.stream.CachedInfo().Config.Name, "projector")
				defer nc.Close()
				done := make(chan error, 1)
				go func() { done <- c.Consume(context.Background(), cons) }()
				be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {"order-1"}}, "order-1")
				be.drained()
				if end == "consumer deleted" {
					if err := be.js.DeleteConsumer(context.Background(), be.stream.CachedInfo().Config.Name, "projector"); err != nil {
						t.Fatal(err)
					}
				} else {
					nc.Close()
				}
				select {
				case err := <-done:
					if !errors.Is(err, ErrClosed) {
						t.Fatalf("Consume = %v, want ErrClosed", err)
					}
				case <-time.After(inboxtest.Patience()):
					t.Fatal("Consume still running after the consumption was closed")
				}
				inboxtest.ExactlyOnce(t, b, []string{"order-1"})
			})
		}
	})
}
