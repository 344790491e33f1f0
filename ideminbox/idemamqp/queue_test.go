package idemamqp

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
)

// ConsumeQueue consumes with manual acknowledgements, so that a message
// whose handler failed comes back and runs again; it cancels its broker
// consumer when it returns.
func TestConsumeQueue(t *testing.T) {
	b := inboxtest.SQLite(t)
	be := newBench(t, b, "quorum")
	conn, err := amqp.Dial(be.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet,
		RetryDelayFunc: func(int) time.Duration { return 10 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	acked := make(chan string, 10)
	failed := false
	c, err := NewConsumer(inbox, func(ctx context.Context, d amqp.Delivery) error {
		if d.MessageId == "order-0" && !failed {
			failed = true
			return errors.New("first run fails")
		}
		return effect(b)(ctx, d)
	}, &Config{ObserveFunc: func(d amqp.Delivery, dec ideminbox.Decision, err error) {
		if dec.Action == ideminbox.Ack {
			acked <- d.MessageId
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	be.publish("order-0", "order-0")
	be.publish("order-1", "order-1")
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.ConsumeQueue(ctx, ch, be.queue, "") }()
	for range 2 {
		select {
		case <-acked:
		case err := <-done:
			t.Fatalf("ConsumeQueue: %v", err)
		case <-time.After(inboxtest.Patience()):
			t.Fatal("timed out waiting for both messages")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	inboxtest.ExactlyOnce(t, b, []string{"order-0", "order-1"})
	q, err := be.ch.QueueDeclarePassive(be.queue, true, false, false, false, be.args)
	if err != nil || q.Consumers != 0 || q.Messages != 0 {
		t.Fatalf("queue after ConsumeQueue returned: %+v, %v; want no consumer, no message", q, err)
	}
}
