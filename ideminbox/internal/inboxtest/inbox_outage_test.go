package inboxtest_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
// returns the decisions, "action@attempt", holds left out.
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
				t.Fatalf("the store never answered again: %v", err)
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
	t.Fatalf("message %s never settled: %v", msg.ID, trace)
	return nil
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
		in := newInbox(t, nil, func(c *ideminbox.Config) {
			c.Store, c.Engine = nil, engine
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
	in := newInbox(t, nil, func(c *ideminbox.Config) {
		c.Store, c.Engine = nil, engine
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
// will complete (the consumer that took it stopped while the handler ran,
// as a message that kills its consumer does) is held until that claim's
// lease ends, then recorded as poison without running again. A delivery
// past MaxAttempts whose key is free (the earlier ones were given back
// before they ran) runs once more.
func TestUnansweredPastMaxAttempts(t *testing.T) {
	inboxtest.ForEach(t, func(t *testing.T, b *inboxtest.Backend) {
		store := b.NewStore(t)
		var dead []string
		in := newInbox(t, store, func(c *ideminbox.Config) {
			c.MaxAttempts = 3
			c.InFlightDelay = 20 * time.Millisecond
			c.DeadLetterFunc = func(ctx context.Context, msg ideminbox.Message, cause error) error {
				dead = append(dead, msg.ID)
				return b.Insert(ctx, inboxtest.DeadLetters, msg.ID, cause.Error())
			}
		})
		ctx := context.Background()
		// What a consumer that died while running m leaves behind.
		claim, err := store.Claim(ctx, idem.ClaimParams{
			Tenant: ideminbox.Tenant("orders"), Key: "m", Token: 42, Lease: 500 * time.Millisecond, Retention: time.Hour,
		})
		if err != nil || !claim.Won {
			t.Fatalf("claim: %+v, %v", claim, err)
		}
		runs := 0
		h := func(ctx context.Context) error { runs++; return nil }
		trace := hold(t, in, ideminbox.Message{ID: "m", Attempt: 4, Data: []byte("payload")}, h)
		if !slices.Equal(trace, []string{"ack-poison@4"}) || runs != 0 || !slices.Equal(dead, []string{"m"}) {
			t.Fatalf("decisions %v, %d runs, dead letters %v; want [ack-poison@4], no run, m dead-lettered", trace, runs, dead)
		}
		st, err := in.Status(ctx, "m")
		if err != nil || st.State != ideminbox.StatePoison || st.Error != ideminbox.ErrUnanswered.Error() || st.Attempt != 4 || string(st.Data) != "payload" {
			t.Fatalf("status %+v, %v", st, err)
		}

		trace = hold(t, in, ideminbox.Message{ID: "n", Attempt: 4}, h)
		if !slices.Equal(trace, []string{"ack@4"}) || runs != 1 {
			t.Fatalf("past MaxAttempts, key free: decisions %v, %d runs; want [ack@4] after one run", trace, runs)
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
