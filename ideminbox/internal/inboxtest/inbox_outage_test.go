package inboxtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/internal/testenv"
)

// hold plays an adapter that holds deliveries as Process asks: it
// processes the same delivery again after a Hold (once the store answers,
// or after the delay), and moves to the next delivery after a Nack. It
// returns the decisions, "action@attempt", holds left out. It reports
// only with t.Errorf, so goroutines may call it.
func hold(t *testing.T, in *ideminbox.Inbox, msg ideminbox.Message, h ideminbox.HandlerFunc) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var trace []string
	for range 10000 {
		d, err := in.Process(ctx, msg, h)
		switch {
		case d.AwaitsStore(err):
			if err := in.AwaitStore(ctx); err != nil {
				t.Errorf("the store never answered again: %v", err)
				return trace
			}
			continue
		case d.Action == ideminbox.Hold:
			time.Sleep(d.Delay)
			continue
		}
		trace = append(trace, fmt.Sprintf("%s@%d", d.Action, msg.Attempt))
		if d.Action != ideminbox.Nack {
			return trace
		}
		msg.Attempt++
		time.Sleep(d.Delay)
	}
	t.Errorf("message %s never settled: %v", msg.ID, trace)
	return trace
}

// An adapter that cannot hold gives every delivery Process answered Hold
// back to the broker, which counts one more delivery each time. The inbox
// takes those off its count: after five deliveries met the store down,
// the handler's first failure is attempt 1, not attempt 6, and the
// message is not poison.
func TestStoreOutageGivenBackIsNotAnAttempt(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		in := newInbox(t, o.NewStore(t), func(c *ideminbox.Config) { c.MaxAttempts = 5 })
		runs := 0
		h := func(ctx context.Context) error {
			runs++
			if runs == 1 {
				return errors.New("first run fails")
			}
			return nil
		}
		ctx := context.Background()
		o.Down()
		msg := ideminbox.Message{ID: "m"}
		for msg.Attempt = 1; msg.Attempt <= 5; msg.Attempt++ {
			d, err := in.Process(ctx, msg, h)
			if d.Action != ideminbox.Hold || !errors.Is(err, idem.ErrStore) {
				t.Fatalf("delivery %d with the store down: %+v, %v; want hold and a store error", msg.Attempt, d, err)
			}
		}
		o.Up()
		if err := in.AwaitStore(ctx); err != nil {
			t.Fatal(err)
		}
		if d, err := in.Process(ctx, msg, h); d.Action != ideminbox.Nack || err == nil || err.Error() != "first run fails" {
			t.Fatalf("delivery %d, the handler's first run fails: %+v, %v; want nack", msg.Attempt, d, err)
		}
		msg.Attempt++
		if d, err := in.Process(ctx, msg, h); d.Action != ideminbox.Ack || err != nil || runs != 2 {
			t.Fatalf("delivery %d: %+v, %v after %d runs; want ack after 2", msg.Attempt, d, err, runs)
		}
	})
}

// The store goes down while the handler runs, which then fails because of
// it. That failure is not counted: the delivery is held until the store
// answers, and run again (once the lease of the claim nobody could release
// has ended). Only the handler's own failure, afterwards, is attempt 1;
// with MaxAttempts 2 the message is processed, not poisoned.
func TestStoreDownUnderHandlerIsNotAnAttempt(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		engine, err := idem.NewEngine(o.NewStore(t), &idem.Config{Lease: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		in := newInboxOn(t, engine, func(c *ideminbox.Config) {
			c.MaxAttempts = 2
			c.InFlightDelay = 50 * time.Millisecond
		})
		runs := 0
		h := func(ctx context.Context) error {
			runs++
			switch runs {
			case 1:
				o.Down()
				if err := o.Insert(ctx, inboxtest.Effects, "m", "run 1"); err != nil {
					return err
				}
				return errors.New("the store went away")
			case 2:
				return errors.New("the handler's own failure")
			}
			return o.Insert(ctx, inboxtest.Effects, "m", fmt.Sprint("run ", runs))
		}
		go func() {
			// The store check after the failure finds the store down:
			// bring it back.
			for o.FailedClaims.Load() == 0 {
				time.Sleep(10 * time.Millisecond)
			}
			o.Up()
		}()
		trace := hold(t, in, ideminbox.Message{ID: "m", Attempt: 1}, h)
		if !slices.Equal(trace, []string{"nack@1", "ack@2"}) || runs != 3 {
			t.Fatalf("decisions %v after %d runs; want [nack@1 ack@2] after 3", trace, runs)
		}
		if st, err := in.Status(context.Background(), "m"); err != nil || st.State != ideminbox.StateProcessed {
			t.Fatalf("status %+v, %v", st, err)
		}
		if o.Transactional {
			if rows := o.Rows(t, inboxtest.Effects); !slices.Equal(rows, []string{"m"}) {
				t.Fatalf("effects %v, want the last run's only", rows)
			}
		}
	})
}

// The handler succeeds, and the store goes down before its outcome is
// stored: the completion fails, and so does the release, so the key stays
// held by a claim nobody will answer. The consumer stops before the store
// comes back, giving the delivery back; the broker counts it. The next
// delivery, to another consumer, comes past MaxAttempts (one real
// failure, then the delivery whose outcome was lost) and finds the key
// held: that is no crash of the handler's, and must not make the message
// poison. It runs once more, as soon as the claim's lease ends, and is
// processed: one effect on a store with transactions (the lost run's
// writes were rolled back with its commit), and no dead letter.
func TestLostOutcomeIsNotPoison(t *testing.T) {
	inboxtest.Outages(t, func(t *testing.T, o *inboxtest.Outage) {
		var dead []string
		consumer := func() *ideminbox.Inbox {
			engine, err := idem.NewEngine(o.NewStore(t), &idem.Config{Lease: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return newInboxOn(t, engine, func(c *ideminbox.Config) {
				c.MaxAttempts = 2
				c.InFlightDelay = 50 * time.Millisecond
				c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
					dead = append(dead, cause.Error())
					return nil
				}
			})
		}
		runs := 0
		h := func(ctx context.Context) error {
			runs++
			switch runs {
			case 1:
				return errors.New("the handler's own failure")
			case 2:
				if err := o.Insert(ctx, inboxtest.Effects, "m", "run 2"); err != nil {
					return err
				}
				o.Down()
				return nil
			}
			return o.Insert(ctx, inboxtest.Effects, "m", fmt.Sprint("run ", runs))
		}
		ctx := context.Background()
		first := consumer()
		msg := ideminbox.Message{ID: "m", Attempt: 1, Data: []byte("payload")}
		if d, err := first.Process(ctx, msg, h); d.Action != ideminbox.Nack || err == nil {
			t.Fatalf("delivery 1: %+v, %v; want nack", d, err)
		}
		msg.Attempt = 2
		if d, err := first.Process(ctx, msg, h); !d.AwaitsStore(err) || runs != 2 {
			t.Fatalf("delivery 2, the outcome lost: %+v, %v after %d runs; want hold until the store answers", d, err, runs)
		}
		// The first consumer stops here, and its delivery goes back.
		o.Up()
		if st, err := first.Status(ctx, "m"); err != nil || st.State != ideminbox.StateInFlight {
			t.Fatalf("status once the store is back: %+v, %v; want in flight (neither completed nor released)", st, err)
		}

		msg.Attempt = 3
		trace := hold(t, consumer(), msg, h)
		if !slices.Equal(trace, []string{"ack@3"}) || runs != 3 || len(dead) != 0 {
			t.Fatalf("delivery 3, to another consumer: decisions %v after %d runs, dead letters %q; want [ack@3] after a third run, none dead-lettered",
				trace, runs, dead)
		}
		if st, err := first.Status(ctx, "m"); err != nil || st.State != ideminbox.StateProcessed {
			t.Fatalf("status %+v, %v; want processed", st, err)
		}
		if o.Transactional {
			if rows := o.Rows(t, inboxtest.Effects); !slices.Equal(rows, []string{"m"}) {
				t.Fatalf("effects %v, want the third run's only", rows)
			}
		}
	})
}

// On a store without transactions, the handler ran and the store went
// down before its answer was stored: nothing can undo what it did, so the
// key is not released; it stays held until its lease ends, and only then
// does the message run again. That second execution is the window the
// package documentation states: a store with transactions has none.
func TestNonTransactionalCompletionLost(t *testing.T) {
	o := inboxtest.RedisOutage(t)
	engine, err := idem.NewEngine(o.NewStore(t), &idem.Config{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	in := newInboxOn(t, engine, func(c *ideminbox.Config) {
		c.InFlightDelay = 50 * time.Millisecond
	})
	ctx := context.Background()
	runs := 0
	h := func(ctx context.Context) error {
		runs++
		if err := o.Insert(ctx, inboxtest.Effects, "m", fmt.Sprint("run ", runs)); err != nil {
			return err
		}
		if runs == 1 {
			o.Down()
		}
		return nil
	}
	msg := ideminbox.Message{ID: "m", Attempt: 1}
	d, err := in.Process(ctx, msg, h)
	if !d.AwaitsStore(err) {
		t.Fatalf("completion lost: %+v, %v; want hold until the store answers", d, err)
	}
	o.Up()
	if err := in.AwaitStore(ctx); err != nil {
		t.Fatal(err)
	}
	// Neither completed nor released: held by the claim of the first run.
	if st, err := in.Status(ctx, "m"); err != nil || st.State != ideminbox.StateInFlight {
		t.Fatalf("status once the store is back: %+v, %v; want in flight", st, err)
	}
	for {
		d, err = in.Process(ctx, msg, h)
		if d.Action != ideminbox.Hold {
			break
		}
		if !errors.Is(err, idem.ErrInFlight) {
			t.Fatalf("held for %v, want in flight", err)
		}
		time.Sleep(d.Delay)
	}
	if d.Action != ideminbox.Ack || err != nil || runs != 2 || len(o.Rows(t, inboxtest.Effects)) != 2 {
		t.Fatalf("after the store came back: %+v, %v, %d runs, effects %v; want ack after a second run, once the lease ended",
			d, err, runs, o.Rows(t, inboxtest.Effects))
	}
}

// On a store without transactions, the consumer shuts down (ctx ends)
// while a handler runs, and the handler returns no error: the engine
// stores its answer all the same, so the delivery is acknowledged, not
// given back; its redelivery, if any, is a duplicate.
func TestNonTransactionalCancelledIsStored(t *testing.T) {
	for _, b := range []*inboxtest.Backend{inboxtest.Mem(t), inboxtest.Redis(t)} {
		t.Run(b.Name, func(t *testing.T) {
			in := newInbox(t, b.NewStore(t), nil)
			ctx, cancel := context.WithCancel(context.Background())
			runs := 0
			d, err := in.Process(ctx, ideminbox.Message{ID: "m", Attempt: 1}, func(ctx context.Context) error {
				runs++
				cancel()
				return b.Insert(ctx, inboxtest.Effects, "m", "run")
			})
			if d.Action != ideminbox.Ack || err != nil {
				t.Fatalf("cancelled after the handler's work: %+v, %v; want ack", d, err)
			}
			if st, err := in.Status(context.Background(), "m"); err != nil || st.State != ideminbox.StateProcessed {
				t.Fatalf("status %+v, %v", st, err)
			}
			d, err = in.Process(context.Background(), ideminbox.Message{ID: "m", Attempt: 2}, func(ctx context.Context) error {
				runs++
				return nil
			})
			if d.Action != ideminbox.AckDuplicate || err != nil || runs != 1 {
				t.Fatalf("redelivery: %+v, %v, %d runs", d, err, runs)
			}

			// The same while a poison message is dead-lettered.
			poison := newInbox(t, b.NewStore(t), func(c *ideminbox.Config) {
				c.MaxAttempts = 1
				c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
					cancel()
					return b.Insert(ctx, inboxtest.DeadLetters, msg.ID, cause.Error())
				}
			})
			ctx, cancel = context.WithCancel(context.Background())
			defer cancel()
			d, err = poison.Process(ctx, ideminbox.Message{ID: "p", Attempt: 1}, func(context.Context) error { return errors.New("bad") })
			if d.Action != ideminbox.AckPoison || err == nil || err.Error() != "bad" {
				t.Fatalf("cancelled while dead-lettering: %+v, %v; want ack-poison", d, err)
			}
			if st, err := poison.Status(context.Background(), "p"); err != nil || st.State != ideminbox.StatePoison {
				t.Fatalf("status %+v, %v", st, err)
			}
		})
	}
}

// A delivery past MaxAttempts whose key is still held by a claim nobody
// will complete (its consumer stopped while the handler ran, as a message
// that kills its consumer does) grants the message a last run: it is held
// until that claim's lease ends, then runs. That last run stalls here
// (its lease runs out, no heartbeat), as a consumer killed by the message
// again would leave it; the next delivery finds the key held by the last
// run's claim, not the one it was granted over, and records the message
// as poison without running it, once that lease has ended. The stalled
// run's completion is then refused, and its delivery acknowledged as a
// duplicate. A delivery past MaxAttempts whose key is free (the earlier
// ones were given back before they ran) runs once more.
func TestUnansweredPastMaxAttempts(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		var mu sync.Mutex
		var dead []string
		consumer := func() (idem.Store, *ideminbox.Inbox) {
			store := b.NewStore(t)
			engine, err := idem.NewEngine(store, &idem.Config{Lease: 300 * time.Millisecond, Heartbeat: -1})
			if err != nil {
				t.Fatal(err)
			}
			return store, newInboxOn(t, engine, func(c *ideminbox.Config) {
				c.MaxAttempts = 3
				c.InFlightDelay = 20 * time.Millisecond
				c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
					mu.Lock()
					dead = append(dead, msg.ID)
					mu.Unlock()
					return b.Insert(ctx, inboxtest.DeadLetters, msg.ID, cause.Error())
				}
			})
		}
		store, first := consumer()
		_, second := consumer()
		ctx := context.Background()
		// What a consumer that died while running m leaves behind.
		claim, err := store.Claim(ctx, idem.ClaimParams{
			Tenant: ideminbox.Tenant("orders"), Key: "m", Token: 42, Lease: 300 * time.Millisecond, Retention: time.Hour,
		})
		if err != nil || !claim.Won {
			t.Fatalf("claim: %+v, %v", claim, err)
		}
		var runs atomic.Int32
		entered, stalled := make(chan struct{}), make(chan struct{})
		lastRun := make(chan []string)
		go func() {
			lastRun <- hold(t, first, ideminbox.Message{ID: "m", Attempt: 4, Data: []byte("payload")}, func(ctx context.Context) error {
				if runs.Add(1) == 1 {
					close(entered)
					<-stalled
				}
				return nil
			})
		}()
		select {
		case <-entered:
		case trace := <-lastRun:
			t.Fatalf("delivery 4, past MaxAttempts: decisions %v, the handler never ran; want a last run", trace)
		}
		trace := hold(t, second, ideminbox.Message{ID: "m", Attempt: 5, Data: []byte("payload")}, func(ctx context.Context) error {
			runs.Add(1)
			return nil
		})
		close(stalled)
		if !slices.Equal(trace, []string{"ack-poison@5"}) || runs.Load() != 1 || !slices.Equal(dead, []string{"m"}) {
			t.Fatalf("delivery 5, the last run stalled: decisions %v, %d runs, dead letters %v; want [ack-poison@5], the last run only, m dead-lettered",
				trace, runs.Load(), dead)
		}
		if trace := <-lastRun; !slices.Equal(trace, []string{"ack-duplicate@4"}) {
			t.Fatalf("delivery 4, whose last run stalled: decisions %v, want [ack-duplicate@4]", trace)
		}
		st, err := first.Status(ctx, "m")
		if err != nil || st.State != ideminbox.StatePoison || st.Error != ideminbox.ErrUnanswered.Error() || st.Attempt != 5 || string(st.Data) != "payload" {
			t.Fatalf("status %+v, %v", st, err)
		}
		if rows := b.Rows(t, inboxtest.DeadLetters); !slices.Equal(rows, []string{"m"}) {
			t.Fatalf("dead letters %v, want m once", rows)
		}

		trace = hold(t, first, ideminbox.Message{ID: "n", Attempt: 4}, func(ctx context.Context) error { runs.Add(1); return nil })
		if !slices.Equal(trace, []string{"ack@4"}) || runs.Load() != 2 {
			t.Fatalf("past MaxAttempts, key free: decisions %v, %d runs; want [ack@4] after one more run", trace, runs.Load())
		}
	})
}

// A poison message larger than MariaDB's max_allowed_packet is recorded:
// the record keeps the payload's first MaxPoisonData bytes and its whole
// length. Kept whole, the record could never be written, and the message
// would come back forever.
func TestPoisonLargerThanMaxAllowedPacket(t *testing.T) {
	db := openDB(t, "mysql", testenv.MySQLDSN(t))
	var packet int
	if err := db.QueryRow("SELECT @@max_allowed_packet").Scan(&packet); err != nil {
		t.Fatal(err)
	}
	if packet > 256<<20 {
		t.Skipf("max_allowed_packet is %d bytes: too large to exceed here", packet)
	}
	store := migrated(t, db, idemmigrate.MySQL, idemmysql.Dialect)
	var hooked int
	in := newInbox(t, store, func(c *ideminbox.Config) {
		c.MaxAttempts = 1
		c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
			hooked = len(msg.Data)
			return nil
		}
	})
	payload := bytes.Repeat([]byte("0123456789abcdef"), (packet+1<<20)/16)
	long := strings.Repeat("a very long error ", 1000)
	d, err := in.Process(context.Background(), ideminbox.Message{ID: "big", Attempt: 1, Data: payload, Subject: long},
		func(context.Context) error { return errors.New(long) })
	if d.Action != ideminbox.AckPoison || err == nil || err.Error() != long {
		t.Fatalf("poison of %d bytes: %+v, %.80v", len(payload), d, err)
	}
	st, err := in.Status(context.Background(), "big")
	if err != nil || st.State != ideminbox.StatePoison || st.DataSize != len(payload) ||
		!bytes.Equal(st.Data, payload[:ideminbox.DefaultMaxPoisonData]) || hooked != len(payload) ||
		len(st.Error) > 4096 || !strings.HasPrefix(st.Error, "a very long error") || len(st.Subject) > 4096 {
		t.Fatalf("status: state %v, data %d of %d bytes, error %d bytes, subject %d bytes, hook got %d bytes, %v",
			st.State, len(st.Data), st.DataSize, len(st.Error), len(st.Subject), hooked, err)
	}
}
