package idemjetstream

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
)

// The store goes down before messages arrive, for longer than several
// AckWaits and for more checks than the consumer's MaxDeliver (the least
// Check accepts). Consume holds the message in hand,
// reports it in progress and fetches nothing more until the store answers
// again: every message then runs once, on its first delivery; the server
// neither redelivered nor dropped any.
func TestStoreOutageSpendsNoDelivery(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		const maxAttempts = 5
		const maxDeliver = maxAttempts + 2 + ideminbox.GivenBackMargin
		be := newBench(t, o.Backend, jetstream.ConsumerConfig{MaxDeliver: maxDeliver, AckWait: time.Second})
		ids := inboxtest.OrderIDs(3)
		o.Down()
		be.start(func(c *ideminbox.Config) {
			c.MaxAttempts = maxAttempts
			c.StoreRetryInterval = 50 * time.Millisecond
		}, nil, effect(o.Backend), nil)
		for _, k := range ids {
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {k}}, k)
		}
		// Each failed claim is a moment a consumer that gives messages
		// back would have spent a delivery: more than the server allows
		// for all three messages.
		eventually(t, "the store found down more often than MaxDeliver allows", func() bool {
			return o.FailedClaims.Load() >= int64(len(ids)*maxDeliver)
		})
		o.Up()
		be.drained()
		inboxtest.ExactlyOnce(t, o.Backend, ids)
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
	})
}

// With MaxDeliver -1, a store outage long enough for MaxAttempts
// deliveries does not count against the message: once the store is back,
// its handler fails once (attempt 1, nacked), then succeeds. It is never
// recorded as poison.
func TestStoreOutageIsNotAnAttempt(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		const maxAttempts = 5
		be := newBench(t, o.Backend, jetstream.ConsumerConfig{AckWait: time.Second})
		failOnce := func(ctx context.Context, msg jetstream.Msg) error {
			if be.Calls("order-0") == 1 {
				return errors.New("first run fails")
			}
			return effect(o.Backend)(ctx, msg)
		}
		o.Down()
		in := be.start(func(c *ideminbox.Config) {
			c.MaxAttempts = maxAttempts
			c.StoreRetryInterval = 250 * time.Millisecond
		}, nil, failOnce, nil)
		be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {"order-0"}}, "order-0")
		eventually(t, "the store found down more often than MaxAttempts", func() bool {
			return o.FailedClaims.Load() > maxAttempts
		})
		o.Up()
		be.drained()
		inboxtest.ExactlyOnce(t, o.Backend, []string{"order-0"})
		if tr := be.Trace("order-0"); !slices.Equal(tr, []string{"nack@1", "ack@2"}) || be.Calls("order-0") != 2 {
			t.Errorf("decisions %v after %d runs, want [nack@1 ack@2] after 2", tr, be.Calls("order-0"))
		}
		if st, err := in.inbox.Status(context.Background(), "order-0"); err != nil || st.State != ideminbox.StateProcessed {
			t.Errorf("status %+v, %v", st, err)
		}
	})
}
