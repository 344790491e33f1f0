package idemjetstream

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
)

// A handler three times slower than the consumer's AckWait, with two
// instances competing: reported in progress while it runs, its message is
// delivered once and acked once. With the reports off, the server sends
// copies after AckWait, to either instance, which the inbox answers "in
// flight" or, once the first is done, "duplicate" (the work the reports
// exist to avoid); the message still takes effect once.
func TestSlowHandlerKeepsItsMessage(t *testing.T) {
	for _, tc := range []struct {
		name     string
		progress time.Duration
		copies   bool // whether the server sends copies while the handler runs
	}{
		{"progress", 100 * time.Millisecond, false},
		{"no progress", -1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
				be := newBench(t, b, jetstream.ConsumerConfig{AckWait: time.Second})
				slow := func(ctx context.Context, msg jetstream.Msg) error {
					if md, err := msg.Metadata(); err == nil && md.NumDelivered == 1 {
						time.Sleep(3 * time.Second)
					}
					return effect(b)(ctx, msg)
				}
				be.start(nil, &Config{ProgressInterval: tc.progress}, slow, nil)
				be.start(nil, &Config{ProgressInterval: tc.progress}, slow, nil)
				be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {"order-slow"}}, "order-slow")
				be.drained()
				// The server's count of deliveries says whether it sent copies;
				// the inbox's answers to them can come after the first ack (a
				// copy is held while the first one runs, and on SQLite waits
				// for the writer lock), so wait for one final answer per
				// delivery before reading them.
				info, err := be.consumer.Info(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				deliveries := int(info.Delivered.Consumer)
				final := func() []ideminbox.Action {
					return slices.DeleteFunc(be.Decisions("order-slow"), func(a ideminbox.Action) bool { return a == ideminbox.Hold })
				}
				eventually(t, "a final answer to every delivery", func() bool { return len(final()) >= deliveries })
				inboxtest.ExactlyOnce(t, b, []string{"order-slow"})
				decisions := be.Decisions("order-slow")
				copies := deliveries > 1
				if n := len(final()); n != deliveries {
					t.Errorf("%d final answers for %d deliveries", n, deliveries)
				}
				if be.Count("order-slow", ideminbox.Ack) != 1 || copies != tc.copies ||
					slices.ContainsFunc(decisions, func(a ideminbox.Action) bool {
						return a != ideminbox.Ack && a != ideminbox.Hold && a != ideminbox.AckDuplicate
					}) {
					t.Errorf("decisions %v; want one ack, and copies (held while in flight, or duplicate): %v", decisions, tc.copies)
				}
			})
		})
	}
}

// Messages waiting their turn behind a handler three times slower than
// AckWait are neither sent again nor counted again: Consume fetches a
// message only when it can take it, and reports the one fetched in advance
// in progress while it waits. Every message is delivered once.
func TestWaitingMessagesKeepTheirDelivery(t *testing.T) {
	b := inboxtest.SQLite(t)
	be := newBench(t, b, jetstream.ConsumerConfig{AckWait: time.Second})
	ids := inboxtest.OrderIDs(4)
	for _, k := range ids {
		be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {k}}, k)
	}
	slow := func(ctx context.Context, msg jetstream.Msg) error {
		if k, _ := id(msg); k == ids[0] {
			time.Sleep(3 * time.Second)
		}
		return effect(b)(ctx, msg)
	}
	be.start(nil, &Config{ProgressInterval: 200 * time.Millisecond}, slow, nil)
	be.drained()
	inboxtest.ExactlyOnce(t, b, ids)
	for _, k := range ids {
		if tr := be.Trace(k); !slices.Equal(tr, []string{"ack@1"}) {
			t.Errorf("%s: decisions %v, want [ack@1]", k, tr)
		}
	}
	info, err := be.consumer.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Delivered.Consumer != uint64(len(ids)) {
		t.Errorf("the server made %d deliveries for %d messages", info.Delivered.Consumer, len(ids))
	}
}
