package idemjetstream

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/internal/testenv"
)

// Messages without Nats-Msg-Id, published to a stream that was created
// again (a file stream deleted and created, a memory stream lost with its
// server), are numbered from 1 again. They are new messages and all run;
// none is taken for the message of the same number before.
func TestDefaultKeyAcrossStreamIncarnations(t *testing.T) {
	for _, tc := range []struct {
		name    string
		storage jetstream.StorageType
	}{
		{"file stream deleted and created again", jetstream.FileStorage},
		{"memory stream lost with its server", jetstream.MemoryStorage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := inboxtest.SQLite(t)
			url := testenv.NATSURL(t)
			var srv *inboxtest.Server
			if tc.storage == jetstream.MemoryStorage {
				srv = inboxtest.StartNATS(t)
				url = srv.URL()
			}
			inbox, err := ideminbox.NewInbox(inboxtest.Engine(t, b.NewStore(t)), &ideminbox.Config{Consumer: "projector", Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var decisions []string
			answered := make(chan struct{}, 100)
			c, err := NewConsumer(inbox, effect(b), &Config{ObserveFunc: func(msg jetstream.Msg, d ideminbox.Decision, _ error) {
				mu.Lock()
				decisions = append(decisions, fmt.Sprintf("%s %s", d.Action, msg.Data()))
				mu.Unlock()
				answered <- struct{}{}
			}})
			if err != nil {
				t.Fatal(err)
			}
			name := testenv.Name()
			subject := strings.ReplaceAll(name, "_", ".")
			round := func(first int) {
				t.Helper()
				nc, err := nats.Connect(url)
				if err != nil {
					testenv.Unavailable(t, "NATS", err)
				}
				defer nc.Close()
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), inboxtest.Patience())
				defer cancel()
				stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: tc.storage})
				if err != nil {
					testenv.Unavailable(t, "NATS JetStream", err)
				}
				cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "projector", MaxDeliver: -1})
				if err != nil {
					t.Fatal(err)
				}
				for i := first; i < first+3; i++ {
					if _, err := js.Publish(ctx, subject, fmt.Appendf(nil, "order %d", i)); err != nil {
						t.Fatal(err)
					}
				}
				done := make(chan error, 1)
				consumeCtx, stop := context.WithCancel(ctx)
				go func() { done <- c.Consume(consumeCtx, cons) }()
				for range 3 {
					select {
					case <-answered:
					case err := <-done:
						t.Fatalf("Consume: %v", err)
					case <-ctx.Done():
						t.Fatal("timed out waiting for the messages")
					}
				}
				stop()
				if err := <-done; err != nil {
					t.Fatal(err)
				}
				if srv == nil {
					if err := js.DeleteStream(context.Background(), name); err != nil {
						t.Fatal(err)
					}
				}
			}
			round(0)
			if srv != nil {
				srv.Kill()
				srv.Start()
			}
			round(3)
			want := []string{"ack order 0", "ack order 1", "ack order 2", "ack order 3", "ack order 4", "ack order 5"}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(decisions, want) {
				t.Fatalf("decisions %q, want %q", decisions, want)
			}
			if rows := b.Rows(t, inboxtest.Effects); len(rows) != 6 {
				t.Fatalf("%d effects, want 6: %v", len(rows), rows)
			}
		})
	}
}
