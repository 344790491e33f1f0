package idemamqp

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
)

// The store goes down before messages arrive, for more checks than the
// quorum queue's delivery limit allows deliveries (the least limit
// CheckQueueArgs accepts). Consume holds the
// delivery in hand, unsettled, and takes no other until the store answers
// again: every message then runs once, on its first delivery; the broker
// neither redelivered nor dropped any.
func TestStoreOutageSpendsNoDelivery(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		const maxAttempts = 5
		const limit = maxAttempts + 2 + ideminbox.GivenBackMargin
		be := newBenchArgs(t, o.Backend, amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: limit})
		ids := inboxtest.OrderIDs(3)
		o.Down()
		be.start(func(c *ideminbox.Config) {
			c.MaxAttempts = maxAttempts
			c.StoreRetryInterval = 50 * time.Millisecond
		}, nil, effect(o.Backend), nil)
		for _, k := range ids {
			be.publish(k, k)
		}
		// Each failed claim is a moment a consumer that gives deliveries
		// back would have spent one: more than the queue allows for all
		// three messages.
		be.waitFor("the store found down more often than the delivery limit allows", func() bool {
			return o.FailedClaims.Load() >= int64(len(ids)*(limit+1))
		})
		o.Up()
		be.settle("every message acknowledged", func() bool {
			for _, k := range ids {
				if be.Count(k, ideminbox.Ack) == 0 {
					return false
				}
			}
			return true
		})
		inboxtest.ExactlyOnce(t, o.Backend, ids)
		for _, k := range ids {
			if tr := be.Trace(k); !slices.Equal(tr, []string{"ack@1"}) {
				t.Errorf("%s: decisions %v, want [ack@1]", k, tr)
			}
		}
	})
}

// On a quorum queue without a delivery limit, a store outage long enough
// for MaxAttempts deliveries does not count against the message: once the
// store is back, its handler fails once (attempt 1), then succeeds. It is
// never recorded as poison.
func TestStoreOutageIsNotAnAttempt(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		const maxAttempts = 5
		be := newBench(t, o.Backend, "quorum")
		failOnce := func(ctx context.Context, d amqp.Delivery) error {
			calls := be.Calls(d.MessageId)
			if calls == 1 {
				return errors.New("first run fails")
			}
			return effect(o.Backend)(ctx, d)
		}
		o.Down()
		in := be.start(func(c *ideminbox.Config) {
			c.MaxAttempts = maxAttempts
			c.StoreRetryInterval = 50 * time.Millisecond
		}, nil, failOnce, nil)
		be.publish("order-0", "order-0")
		be.waitFor("the store found down more often than MaxAttempts", func() bool {
			return o.FailedClaims.Load() > maxAttempts
		})
		o.Up()
		be.waitFor("the message acknowledged", func() bool {
			return be.Count("order-0", ideminbox.Ack)+be.Count("order-0", ideminbox.AckPoison) > 0
		})
		st, err := in.inbox.Status(context.Background(), "order-0")
		be.settle("nothing left", func() bool { return true })
		inboxtest.ExactlyOnce(t, o.Backend, []string{"order-0"})
		if tr := be.Trace("order-0"); !slices.Equal(tr, []string{"nack@1", "ack@2"}) || be.Calls("order-0") != 2 {
			t.Errorf("decisions %v after %d runs, want [nack@1 ack@2] after 2", tr, be.Calls("order-0"))
		}
		if err != nil || st.State != ideminbox.StateProcessed {
			t.Errorf("status %+v, %v", st, err)
		}
	})
}
