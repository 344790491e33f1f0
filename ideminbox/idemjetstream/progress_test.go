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
				// the inbox's answers to them can come after the first ack (on
				// SQLite a copy waits for the writer lock), so wait for one
				// answer per delivery before reading them.
				info, err := be.consumer.Info(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				deliveries := int(info.Delivered.Consumer)
				eventually(t, "an answer to every delivery", func() bool {
					return len(be.decisionsOf("order-slow")) >= deliveries
				})
				exactlyOnce(t, b, []string{"order-slow"})
				decisions := be.decisionsOf("order-slow")
				copies := deliveries > 1
				if len(decisions) != deliveries {
					t.Errorf("%d answers for %d deliveries", len(decisions), deliveries)
				}
				if be.actions("order-slow", ideminbox.Ack) != 1 || copies != tc.copies ||
					slices.ContainsFunc(decisions, func(a ideminbox.Action) bool {
						return a != ideminbox.Ack && a != ideminbox.Nack && a != ideminbox.AckDuplicate
					}) {
					t.Errorf("decisions %v; want one ack, and copies (answered in flight or duplicate): %v", decisions, tc.copies)
				}
			})
		})
	}
}
