package ideminbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
)

// newEngine returns an engine over store, closed when the test ends.
func newEngine(t testing.TB, store idem.Store) *idem.Engine {
	t.Helper()
	e, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

func newInbox(t *testing.T, store idem.Store, mod func(*ideminbox.Config)) *ideminbox.Inbox {
	t.Helper()
	c := ideminbox.Config{
		Consumer:       "orders",
		MaxAttempts:    3,
		InFlightDelay:  time.Millisecond,
		RetryDelayFunc: func(int) time.Duration { return 0 },
	}
	if mod != nil {
		mod(&c)
	}
	in, err := ideminbox.NewInbox(newEngine(t, store), &c)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// deliver plays a broker: it delivers msg until the inbox says to ack,
// counting deliveries, and returns the final decision. It only reports
// with t.Errorf, so goroutines may call it.
func deliver(t *testing.T, in *ideminbox.Inbox, msg ideminbox.Message, h ideminbox.HandlerFunc) ideminbox.Decision {
	t.Helper()
	for range 1000 {
		msg.Attempt++
		d, err := in.Process(context.Background(), msg, h)
		if d.Acked() || d.Action == ideminbox.Reject {
			return d
		}
		if err == nil {
			t.Errorf("nack without an error: %+v", d)
			return d
		}
		time.Sleep(d.Delay)
	}
	t.Errorf("message %s never acknowledged", msg.ID)
	return ideminbox.Decision{}
}

// Copies of each message delivered at the same instant from many
// goroutines run the handler once per message.
func TestConcurrentDuplicatesRunOnce(t *testing.T) {
	in := newInbox(t, idemmem.NewStore(nil), nil)
	const messages, copies = 20, 8
	var runs [messages]atomic.Int32
	var acks, dups atomic.Int32
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range messages {
		for range copies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				d := deliver(t, in, ideminbox.Message{ID: fmt.Sprintf("order-%d", i)}, func(ctx context.Context) error {
					runs[i].Add(1)
					time.Sleep(time.Millisecond) // keep the key in flight while the copies arrive
					return nil
				})
				switch d.Action {
				case ideminbox.Ack:
					acks.Add(1)
				case ideminbox.AckDuplicate:
					dups.Add(1)
				default:
					t.Errorf("decision %v", d.Action)
				}
			}()
		}
	}
	close(start)
	wg.Wait()
	for i := range messages {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("message %d ran %d times", i, n)
		}
	}
	if acks.Load() != messages || dups.Load() != messages*(copies-1) {
		t.Errorf("acks %d, duplicates %d", acks.Load(), dups.Load())
	}
}

func TestFailedHandlerReleasesKey(t *testing.T) {
	in := newInbox(t, idemmem.NewStore(nil), func(c *ideminbox.Config) { c.MaxAttempts = 5 })
	runs := 0
	d := deliver(t, in, ideminbox.Message{ID: "m1"}, func(ctx context.Context) error {
		runs++
		if runs <= 2 {
			return errors.New("transient")
		}
		return nil
	})
	if d.Action != ideminbox.Ack || runs != 3 {
		t.Fatalf("decision %v after %d runs, want ack after 3", d.Action, runs)
	}
	st, err := in.Status(context.Background(), "m1")
	if err != nil || st.State != ideminbox.StateProcessed {
		t.Fatalf("status %+v, %v", st, err)
	}
}

func TestPoison(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(fmt.Sprintf("local=%v", local), func(t *testing.T) {
			var dead []string
			in := newInbox(t, idemmem.NewStore(nil), func(c *ideminbox.Config) {
				c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
					dead = append(dead, msg.ID+": "+cause.Error())
					return nil
				}
			})
			runs := 0
			h := func(ctx context.Context) error { runs++; return errors.New("boom") }
			msg := ideminbox.Message{ID: "m1", Subject: "order.created", Data: []byte(`{"id":1}`)}
			var d ideminbox.Decision
			var err error
			for i := 1; i <= 3; i++ {
				if !local {
					msg.Attempt = i
				}
				d, err = in.Process(context.Background(), msg, h)
			}
			if d.Action != ideminbox.AckPoison || err == nil || err.Error() != "boom" {
				t.Fatalf("third delivery: %v, %v; want ack-poison, boom", d.Action, err)
			}
			if runs != 3 || len(dead) != 1 || dead[0] != "m1: boom" {
				t.Fatalf("runs %d, dead letters %q", runs, dead)
			}
			st, err := in.Status(context.Background(), "m1")
			if err != nil || st.State != ideminbox.StatePoison || st.Error != "boom" || st.Attempt != 3 ||
				string(st.Data) != `{"id":1}` || st.Subject != "order.created" {
				t.Fatalf("status %+v, %v", st, err)
			}
			msg.Attempt = 4
			d, err = in.Process(context.Background(), msg, h)
			if d.Action != ideminbox.AckDuplicate || err != nil || runs != 3 {
				t.Fatalf("duplicate of a poison message: %v, %v, runs %d", d.Action, err, runs)
			}
		})
	}
}

// A poison message whose error spans lines (errors.Join) is recorded on a
// store that encodes headers (SQLite here), read back by Status, and its
// copies are acked as duplicates. The error is stored with its newline
// escaped: a stored header may not hold a control character.

// A dead-letter hook that fails keeps the message: it is redelivered, runs
// again, and becomes poison when the hook works.
func TestDeadLetterFailureKeepsMessage(t *testing.T) {
	hookCalls := 0
	in := newInbox(t, idemmem.NewStore(nil), func(c *ideminbox.Config) {
		c.MaxAttempts = 1
		c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
			hookCalls++
			if hookCalls == 1 {
				return errors.New("dlq down")
			}
			return nil
		}
	})
	h := func(ctx context.Context) error { return errors.New("boom") }
	d, err := in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 1}, h)
	if d.Action != ideminbox.Nack || err == nil || !strings.Contains(err.Error(), "dlq down") {
		t.Fatalf("first: %v, %v", d.Action, err)
	}
	if st, _ := in.Status(context.Background(), "m"); st.State != ideminbox.StateAbsent {
		t.Fatalf("state after a failed hook: %v", st.State)
	}
	d, _ = in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 2}, h)
	if d.Action != ideminbox.AckPoison || hookCalls != 2 {
		t.Fatalf("second: %v, hook calls %d", d.Action, hookCalls)
	}
}

// Two consumers of the same message each process it once.
func TestConsumersAreIndependent(t *testing.T) {
	store := idemmem.NewStore(nil)
	a := newInbox(t, store, nil)
	b := newInbox(t, store, func(c *ideminbox.Config) { c.Consumer = "billing" })
	runs := 0
	h := func(ctx context.Context) error { runs++; return nil }
	for _, in := range []*ideminbox.Inbox{a, b, a, b} {
		if _, err := in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 1}, h); err != nil {
			t.Fatal(err)
		}
	}
	if runs != 2 {
		t.Fatalf("runs = %d, want one per consumer", runs)
	}
}

func TestInFlightIsHeldWithDelay(t *testing.T) {
	in := newInbox(t, idemmem.NewStore(nil), func(c *ideminbox.Config) { c.InFlightDelay = 7 * time.Second })
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan ideminbox.Decision)
	go func() {
		d, _ := in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 1}, func(ctx context.Context) error {
			close(entered)
			<-release
			return nil
		})
		done <- d
	}()
	<-entered
	d, err := in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 1}, func(ctx context.Context) error {
		t.Error("ran while in flight")
		return nil
	})
	if d.Action != ideminbox.Hold || d.Delay != 7*time.Second || !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("in flight: %+v, %v", d, err)
	}
	close(release)
	if d := <-done; d.Action != ideminbox.Ack {
		t.Fatalf("holder: %v", d.Action)
	}
}

func TestNoIDIsRejected(t *testing.T) {
	in := newInbox(t, idemmem.NewStore(nil), nil)
	d, err := in.Process(context.Background(), ideminbox.Message{}, func(ctx context.Context) error {
		t.Error("ran without an id")
		return nil
	})
	if d.Action != ideminbox.Reject || !errors.Is(err, ideminbox.ErrNoMessageID) {
		t.Fatalf("%v, %v", d.Action, err)
	}
}

func TestCancelledContextIsNotAFailure(t *testing.T) {
	in := newInbox(t, idemmem.NewStore(nil), func(c *ideminbox.Config) { c.MaxAttempts = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	d, err := in.Process(ctx, ideminbox.Message{ID: "m", Attempt: 1}, func(ctx context.Context) error {
		cancel()
		return ctx.Err()
	})
	if d.Action != ideminbox.Nack || d.Delay != 0 || !errors.Is(err, context.Canceled) {
		t.Fatalf("%+v, %v", d, err)
	}
	// idemmem has no transaction: whatever the handler did stands, so the
	// key stays in flight until its lease ends rather than run again now.
	if st, _ := in.Status(context.Background(), "m"); st.State != ideminbox.StateInFlight {
		t.Fatalf("state %v", st.State)
	}
}

func TestKey(t *testing.T) {
	long := strings.Repeat("x", 300)
	for _, id := range []string{long, "with space", "sha256:abc"} {
		k := ideminbox.Key(id)
		if !strings.HasPrefix(k, "sha256:") || len(k) != 7+64 || idem.ValidateKey(k) != nil || k != ideminbox.Key(id) {
			t.Errorf("Key(%.20q) = %q", id, k)
		}
	}
	if k := ideminbox.Key("order-1"); k != "order-1" {
		t.Errorf("Key(order-1) = %q", k)
	}
}

func TestConfigDefaults(t *testing.T) {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	c := in.Config()
	if c.Retention != ideminbox.DefaultRetention ||
		c.MaxAttempts != ideminbox.DefaultMaxAttempts || c.InFlightDelay != ideminbox.DefaultInFlightDelay ||
		c.StoreRetryInterval != ideminbox.DefaultStoreRetryInterval || c.MaxPoisonData != ideminbox.DefaultMaxPoisonData ||
		c.RetryDelayFunc(1) != time.Second || c.RetryDelayFunc(3) != 4*time.Second || c.RetryDelayFunc(30) != time.Minute {
		t.Fatalf("defaults: %+v", c)
	}
	if _, err := ideminbox.NewInbox(nil, &ideminbox.Config{Consumer: "c"}); err == nil {
		t.Error("NewInbox without an engine accepted")
	}
	if _, err := ideminbox.NewInbox(engine, nil); err == nil {
		t.Error("NewInbox without a Config accepted")
	}
	for _, bad := range []ideminbox.Config{
		{},
		{Consumer: strings.Repeat("c", 256)}, // its tenant would not fit MySQL's 512 bytes
		{Consumer: "c\x00"},                  // PostgreSQL refuses NUL in text
		{Consumer: "c\xff"},                  // and invalid UTF-8
		{Consumer: "c\u009b"},                // a control character
	} {
		if _, err := ideminbox.NewInbox(engine, &bad); err == nil {
			t.Errorf("NewInbox(%+v) accepted", bad)
		}
	}
}

// A handler's own errors and panics are failures, whatever they wrap: a
// handler returning idem.ErrInFlight (from an engine of its own) is not
// taken for a message in flight, and ends as poison like any failure.
func TestHandlerErrorsAreFailures(t *testing.T) {
	for name, h := range map[string]ideminbox.HandlerFunc{
		"in-flight": func(ctx context.Context) error { return fmt.Errorf("downstream: %w", idem.ErrInFlight) },
		"store":     func(ctx context.Context) error { return &idem.StoreError{Op: "claim", Err: errors.New("x")} },
		"panic":     func(ctx context.Context) error { panic("bad order") },
	} {
		t.Run(name, func(t *testing.T) {
			in := newInbox(t, idemmem.NewStore(nil), func(c *ideminbox.Config) {
				c.MaxAttempts = 2
				c.RetryDelayFunc = func(int) time.Duration { return time.Hour }
			})
			d, err := in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 1}, h)
			if d.Action != ideminbox.Nack || d.Delay != time.Hour || err == nil {
				t.Fatalf("first delivery: %+v, %v", d, err)
			}
			d, err = in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 2}, h)
			if name == "panic" {
				// idemmem has no transaction: what a panicking handler did
				// may stand, so its key stays held until the lease ends.
				if d.Action != ideminbox.Hold || !errors.Is(err, idem.ErrInFlight) {
					t.Fatalf("second delivery after a panic: %+v, %v; want hold, in flight", d, err)
				}
				return
			}
			if d.Action != ideminbox.AckPoison || err == nil {
				t.Fatalf("second delivery: %+v, %v", d, err)
			}
		})
	}
}

// Consumer keys outlive broker windows by default (7 days), then count as
// absent and are purged by the janitor like HTTP keys.
func TestRetention(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	store := idemmem.NewStore(&idemmem.Config{NowFunc: clock})
	in := newInbox(t, store, nil)
	runs := 0
	h := func(ctx context.Context) error { runs++; return nil }
	msg := ideminbox.Message{ID: "m", Attempt: 1}
	if d, _ := in.Process(context.Background(), msg, h); d.Action != ideminbox.Ack {
		t.Fatalf("first: %v", d.Action)
	}
	advance(6 * 24 * time.Hour)
	if d, _ := in.Process(context.Background(), msg, h); d.Action != ideminbox.AckDuplicate {
		t.Fatalf("after 6 days: %v", d.Action)
	}
	advance(2 * 24 * time.Hour)
	janitor, err := idemjanitor.NewJanitor(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := janitor.PurgeOnce(context.Background()); n != 1 || err != nil {
		t.Fatalf("purge after 8 days: %d, %v", n, err)
	}
	if st, _ := in.Status(context.Background(), "m"); st.State != ideminbox.StateAbsent || runs != 1 {
		t.Fatalf("after purge: %v, runs %d", st.State, runs)
	}
}
