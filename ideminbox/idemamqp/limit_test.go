package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
)

// RabbitMQ counts every delivery a consumer gives back, and a quorum
// queue drops a message past its x-delivery-limit. While the store is
// down, a consumer holds its delivery; each time one stops then (a
// deploy, a crash), the delivery goes back and is counted, although the
// handler never ran. With a limit of MaxAttempts+1, which the inbox once
// advised, a few such stops make RabbitMQ drop a message the inbox has
// neither processed nor recorded as poison: CheckQueueArgs refuses that
// limit, naming the argument and the fix. With the least limit it
// accepts, the same stops leave the message in the queue, and it is
// processed once the store is back.
func TestDeliveryLimitMustLeaveRoom(t *testing.T) {
	const maxAttempts, stops = 2, 4
	o := inboxtest.PostgresOutage(t)
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, o.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet, MaxAttempts: maxAttempts})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(o.Backend), nil)
	if err != nil {
		t.Fatal(err)
	}
	least := inbox.MinDeliveryLimit()
	for _, tc := range []struct {
		limit any
		kept  bool
	}{
		{int64(maxAttempts + 1), false},
		{int64(least), true},
	} {
		t.Run(fmt.Sprint(tc.limit), func(t *testing.T) {
			args := amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: tc.limit}
			err := c.CheckQueueArgs(args)
			switch {
			case tc.kept && err != nil:
				t.Fatalf("CheckQueueArgs: %v", err)
			case !tc.kept && (!errors.Is(err, ErrQueueArgs) || !strings.Contains(err.Error(), fmt.Sprintf("x-delivery-limit is %v", tc.limit)) ||
				!strings.Contains(err.Error(), "to -1") || !strings.Contains(err.Error(), fmt.Sprintf("at least %d", least))):
				t.Fatalf("CheckQueueArgs: %v; want a refusal naming x-delivery-limit, -1 and %d", err, least)
			}

			be := newBenchArgs(t, o.Backend, args)
			id := "order-" + fmt.Sprint(tc.limit)
			be.publish(id, id)
			o.Down()
			for stop := 1; stop <= stops; stop++ {
				var held int
				be.locked(func() bool { held = be.Count(id, ideminbox.Hold); return true })
				in := be.start(func(c *ideminbox.Config) {
					c.MaxAttempts = maxAttempts
					c.StoreRetryInterval = 50 * time.Millisecond
				}, nil, effect(o.Backend), nil)
				if !waitUntil(func() bool { return be.locked(func() bool { return be.Count(id, ideminbox.Hold) > held }) }) {
					if tc.kept {
						t.Fatalf("stop %d: the message was not delivered again", stop)
					}
					in.stop()
					break
				}
				in.stop() // gives the held delivery back
			}
			q, err := be.ch.QueueDeclarePassive(be.queue, true, false, false, false, args)
			if err != nil {
				t.Fatal(err)
			}
			o.Up()
			// A fresh store: the outage cut the connections of the others.
			inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, o.NewStore(t)), &ideminbox.Config{Consumer: "projector"})
			if err != nil {
				t.Fatal(err)
			}
			if !tc.kept {
				if q.Messages != 0 {
					t.Fatalf("%d messages in the queue after %d deliveries given back; want the message dropped", q.Messages, stops)
				}
				if st, err := inbox.Status(context.Background(), id); err != nil || st.State != ideminbox.StateAbsent {
					t.Fatalf("status %+v, %v; want absent: neither processed nor poison", st, err)
				}
				return
			}
			be.start(func(c *ideminbox.Config) { c.MaxAttempts = maxAttempts }, nil, effect(o.Backend), nil)
			be.settle("the message processed", func() bool { return be.Count(id, ideminbox.Ack) == 1 })
			if st, err := inbox.Status(context.Background(), id); err != nil || st.State != ideminbox.StateProcessed {
				t.Fatalf("status %+v, %v; want processed", st, err)
			}
		})
	}
}

// waitUntil waits for cond for a few seconds, and reports whether it
// held.
func waitUntil(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

// CheckQueueArgs accepts no limit (-1), a limit with room, and a queue
// that has none; it refuses a limit without room, one that is not an
// integer, and a quorum queue declared without one when RabbitMQ 4's
// default (20) leaves no room.
func TestCheckQueueArgs(t *testing.T) {
	check := func(maxAttempts int, args amqp.Table) error {
		inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, inboxtest.Mem(t).NewStore(t)), &ideminbox.Config{Consumer: "projector", MaxAttempts: maxAttempts})
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewConsumer(inbox, effect(inboxtest.Mem(t)), nil)
		if err != nil {
			t.Fatal(err)
		}
		return c.CheckQueueArgs(args)
	}
	for _, tc := range []struct {
		maxAttempts int
		args        amqp.Table
		ok          bool
	}{
		{5, amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: int64(-1)}, true},
		{5, amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: int32(17)}, true},
		{5, amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: int32(16)}, false},
		{5, amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: int64(0)}, false},
		{5, amqp.Table{"x-queue-type": "quorum", DeliveryLimitArg: "20"}, false},
		{5, amqp.Table{"x-queue-type": "quorum"}, true},   // RabbitMQ 4's 20 leaves room for 5 attempts
		{10, amqp.Table{"x-queue-type": "quorum"}, false}, // but not for 10
		{10, amqp.Table{"x-queue-type": "classic"}, true},
		{10, nil, true},
	} {
		err := check(tc.maxAttempts, tc.args)
		if tc.ok != (err == nil) || (err != nil && (!errors.Is(err, ErrQueueArgs) || !strings.Contains(err.Error(), "-1"))) {
			t.Errorf("MaxAttempts %d, arguments %v: %v; want accepted: %v", tc.maxAttempts, tc.args, err, tc.ok)
		}
	}
}
