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
			inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
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
			msg, err := be.consumer.Next(jetstream.FetchMaxWait(inboxtest.Patience()))
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
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
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

// A finite MaxDeliver is accepted only with room for every delivery the
// inbox may need before it decides a message's fate: MaxAttempts, the two
// that end a crash loop, and the deliveries given back without running.
// Below that (MaxAttempts+1 was once accepted) the server stops
// delivering a message that is neither processed nor recorded as poison:
// Check refuses, naming the setting and the fix. -1 (unlimited, the
// advice) and the server's default are accepted.
func TestCheckRefusesMaxDeliverWithoutMargin(t *testing.T) {
	const maxAttempts = 5
	b := inboxtest.Mem(t)
	inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet, MaxAttempts: maxAttempts})
	if err != nil {
		t.Fatal(err)
	}
	least := inbox.MinDeliveryLimit()
	if least != maxAttempts+2+ideminbox.GivenBackMargin {
		t.Fatalf("MinDeliveryLimit %d", least)
	}
	c, err := NewConsumer(inbox, effect(b), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		maxDeliver int
		ok         bool
	}{
		{maxAttempts, false},
		{maxAttempts + 1, false},
		{maxAttempts + 2, false},
		{least - 1, false},
		{least, true},
		{-1, true},
		{0, true}, // the server's default: unlimited
	} {
		t.Run(fmt.Sprint(tc.maxDeliver), func(t *testing.T) {
			be := newBench(t, b, jetstream.ConsumerConfig{MaxDeliver: tc.maxDeliver})
			if tc.maxDeliver == 0 {
				// newBench makes 0 mean -1; leave it to the server.
				if err := be.stream.DeleteConsumer(context.Background(), "projector"); err != nil {
					t.Fatal(err)
				}
				cons, err := be.stream.CreateConsumer(context.Background(), jetstream.ConsumerConfig{Durable: "projector"})
				if err != nil {
					t.Fatal(err)
				}
				be.consumer = cons
			}
			err := c.Check(context.Background(), be.consumer)
			if tc.ok {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrConsumerConfig) || !strings.Contains(err.Error(), fmt.Sprintf("MaxDeliver %d", tc.maxDeliver)) ||
				!strings.Contains(err.Error(), "Set MaxDeliver to -1") || !strings.Contains(err.Error(), fmt.Sprintf("at least %d", least)) {
				t.Fatalf("Check: %v; want a refusal naming MaxDeliver, -1 and %d", err, least)
			}
		})
	}
}
