package idemjetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
)

// A consumer acknowledging all (or none) would lose the messages whose
// handler failed: the next ack covers them (AckAll), or nothing is ever
// redelivered (AckNone). Consume and Check refuse it, saying why; Handle
// refuses its messages, leaving them untouched; the handler never runs.
func TestAckPolicyMustBeExplicit(t *testing.T) {
	for _, policy := range []jetstream.AckPolicy{jetstream.AckAllPolicy, jetstream.AckNonePolicy} {
		t.Run(policy.String(), func(t *testing.T) {
			b := inboxtest.Mem(t)
			be := newBench(t, b, jetstream.ConsumerConfig{AckPolicy: policy})
			inbox, err := ideminbox.NewInbox(&ideminbox.Config{Store: b.NewStore(t), Consumer: "projector", Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			runs := 0
			c, err := NewConsumer(inbox, func(context.Context, jetstream.Msg) error { runs++; return errors.New("fails") }, nil)
			if err != nil {
				t.Fatal(err)
			}
			be.publish(context.Background(), nats.Header{nats.MsgIdHdr: {"order-1"}}, "order-1")
			// The deadline only bounds a Consume that wrongly accepted the
			// consumer: a refusal comes at once.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err = c.Consume(ctx, be.consumer)
			if !errors.Is(err, ErrConsumerConfig) || !strings.Contains(err.Error(), "ack policy "+policy.String()) {
				t.Fatalf("Consume over an %s consumer: %v", policy, err)
			}
			if err := c.Check(ctx, be.consumer); !errors.Is(err, ErrConsumerConfig) {
				t.Fatalf("Check: %v", err)
			}
			msg, err := be.consumer.Next(jetstream.FetchMaxWait(patience()))
			if err != nil {
				t.Fatal(err)
			}
			d, err := c.Handle(ctx, msg)
			if !errors.Is(err, ErrNotChecked) || d.Action != 0 || runs != 0 {
				t.Fatalf("Handle: %+v, %v, %d runs; want refused, not run", d, err, runs)
			}
		})
	}
}

// Handle processes the messages of a consumer Check accepted, and only
// after Check.
func TestHandleAfterCheck(t *testing.T) {
	b := inboxtest.Mem(t)
	be := newBench(t, b, jetstream.ConsumerConfig{})
	inbox, err := ideminbox.NewInbox(&ideminbox.Config{Store: b.NewStore(t), Consumer: "projector", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(inbox, effect(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 2 {
		be.publish(ctx, nil, fmt.Sprint("order ", i))
	}
	msg, err := be.consumer.Next()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Handle(ctx, msg); !errors.Is(err, ErrNotChecked) {
		t.Fatalf("Handle before Check: %v", err)
	}
	if err := c.Check(ctx, be.consumer); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Handle(ctx, msg); d.Action != ideminbox.Ack || err != nil {
		t.Fatalf("Handle: %+v, %v", d, err)
	}
	if msg, err = be.consumer.Next(); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Handle(ctx, msg); d.Action != ideminbox.Ack || err != nil {
		t.Fatalf("Handle: %+v, %v", d, err)
	}
	be.drained()
	if rows := b.Rows(t, inboxtest.Effects); len(rows) != 2 {
		t.Fatalf("effects %v", rows)
	}
}
