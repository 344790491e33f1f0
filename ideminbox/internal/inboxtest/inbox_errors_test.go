package inboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/ideminbox/internal/inboxtest"
	"github.com/idem-go/idem/idempg"
)

// Every error Engine.Do can bring back to the inbox, made to happen on
// PostgreSQL (behind a proxy that cuts it), has its answer: what the
// broker is told, after which delay, with which error; and whether the
// delivery counts as an attempt of the handler. Only a handler that ran
// and failed counts (an error, a panic, a success whose writes a failed
// statement had aborted, or a transaction the database kept ending under
// it); a store failure, a message in flight elsewhere, a lost lease, a
// shutdown or a closed inbox never does. With MaxAttempts 2, the next
// delivery's failure tells: poison after a counted delivery, a plain
// retry after one that was not.
func TestEngineErrorDecisions(t *testing.T) {
	o := inboxtest.PostgresOutage(t)
	store := o.NewStore(t)
	const retry, inFlight = 5 * time.Millisecond, 20 * time.Millisecond
	consumer := func(t *testing.T, ec idem.Config) *ideminbox.Inbox {
		if ec.Lease == 0 {
			ec.Lease = time.Second
		}
		engine, err := idem.NewEngine(store, &ec)
		if err != nil {
			t.Fatal(err)
		}
		return newInboxOn(t, engine, func(c *ideminbox.Config) {
			c.MaxAttempts = 2
			c.InFlightDelay = inFlight
			c.StoreRetryInterval = 20 * time.Millisecond
			c.RetryDelayFunc = func(int) time.Duration { return retry }
		})
	}
	claim := func(t *testing.T, key string, token int64) {
		t.Helper()
		c, err := store.Claim(context.Background(), idem.ClaimParams{
			Tenant: ideminbox.Tenant("orders"), Key: key, Token: token, Lease: time.Minute, Retention: time.Hour,
		})
		if err != nil || !c.Won {
			t.Fatalf("claim: %+v, %v", c, err)
		}
	}
	release := func(t *testing.T, key string, token int64) {
		t.Helper()
		if err := store.Release(context.Background(), idem.ReleaseParams{Tenant: ideminbox.Tenant("orders"), Key: key, Token: token}); err != nil {
			t.Fatalf("release: %v", err)
		}
	}
	storeDown := func(err error) bool { return errors.Is(err, idem.ErrStore) }

	for _, tc := range []struct {
		name   string
		engine idem.Config
		// before sets the scene for the first delivery of key and returns
		// its context.
		before func(t *testing.T, in *ideminbox.Inbox, key string) context.Context
		run    func(ctx context.Context, key string) error
		// holds is how many times the first delivery is held, awaiting a
		// store that answers, before its final answer.
		holds   int
		want    ideminbox.Action
		delay   time.Duration
		is      func(err error) bool
		ran     bool
		counted bool
		// after frees the key for the next delivery, if needed.
		after func(t *testing.T, key string)
		// last: there is no next delivery (the inbox is closed).
		last bool
	}{
		{
			name:    "handler error",
			run:     func(context.Context, string) error { return errors.New("bad order") },
			want:    ideminbox.Nack,
			delay:   retry,
			is:      func(err error) bool { return err != nil && err.Error() == "bad order" },
			ran:     true,
			counted: true,
		},
		{
			name:    "handler panic",
			run:     func(context.Context, string) error { panic("bad order") },
			want:    ideminbox.Nack,
			delay:   retry,
			is:      func(err error) bool { var p *idem.PanicError; return errors.As(err, &p) },
			ran:     true,
			counted: true,
		},
		{
			// A failed statement aborts the transaction; the handler
			// swallows the error and answers a success, which cannot stand.
			name: "writes aborted",
			run: func(ctx context.Context, key string) error {
				if err := o.Insert(ctx, inboxtest.Effects, key, "before the failed statement"); err != nil {
					return err
				}
				_, _ = idempg.TxFromContext(ctx).Exec(ctx, "SELECT 1/0")
				return nil
			},
			want:    ideminbox.Nack,
			delay:   retry,
			is:      func(err error) bool { return errors.Is(err, idem.ErrWritesAborted) },
			ran:     true,
			counted: true,
		},
		{
			// The transaction ends under the handler every time (here it
			// sends ROLLBACK itself): nothing it does can be stored. The
			// store answers every check; after three holds the failure is
			// the handler's.
			name: "transaction ended under the handler",
			run: func(ctx context.Context, key string) error {
				tx := idempg.TxFromContext(ctx)
				if err := o.Insert(ctx, inboxtest.Effects, key, "rolled back"); err != nil {
					return err
				}
				_, err := tx.Conn().Exec(ctx, "ROLLBACK")
				return err
			},
			holds:   3,
			want:    ideminbox.Nack,
			delay:   retry,
			is:      storeDown,
			ran:     true,
			counted: true,
		},
		{
			name: "in flight elsewhere",
			before: func(t *testing.T, _ *ideminbox.Inbox, key string) context.Context {
				claim(t, key, 7)
				return context.Background()
			},
			want:  ideminbox.Hold,
			delay: inFlight,
			is:    func(err error) bool { return errors.Is(err, idem.ErrInFlight) },
			after: func(t *testing.T, key string) { release(t, key, 7) },
		},
		{
			// No heartbeat: the lease runs out under the handler, and
			// another execution takes the key over.
			name:   "lease lost",
			engine: idem.Config{Lease: 300 * time.Millisecond, Heartbeat: -1},
			run: func(ctx context.Context, key string) error {
				for {
					c, err := store.Claim(ctx, idem.ClaimParams{
						Tenant: ideminbox.Tenant("orders"), Key: key, Token: 8, Lease: time.Minute, Retention: time.Hour,
					})
					if err != nil || c.Won {
						return err
					}
					time.Sleep(20 * time.Millisecond)
				}
			},
			want:  ideminbox.Hold,
			delay: inFlight,
			is:    func(err error) bool { return errors.Is(err, idem.ErrLeaseLost) },
			ran:   true,
			after: func(t *testing.T, key string) { release(t, key, 8) },
		},
		{
			name: "inbox closed",
			before: func(t *testing.T, in *ideminbox.Inbox, _ string) context.Context {
				if err := in.Close(context.Background()); err != nil {
					t.Fatal(err)
				}
				return context.Background()
			},
			want: ideminbox.Nack,
			is:   func(err error) bool { return errors.Is(err, idem.ErrClosed) },
			last: true,
		},
		{
			name: "context cancelled",
			before: func(t *testing.T, _ *ideminbox.Inbox, _ string) context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				t.Cleanup(cancel)
				return context.WithValue(ctx, cancelKey{}, cancel)
			},
			run: func(ctx context.Context, _ string) error {
				ctx.Value(cancelKey{}).(context.CancelFunc)()
				return ctx.Err()
			},
			want: ideminbox.Nack,
			is:   func(err error) bool { return errors.Is(err, context.Canceled) },
			ran:  true,
		},
		{
			name: "context deadline",
			before: func(t *testing.T, _ *ideminbox.Inbox, _ string) context.Context {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				t.Cleanup(cancel)
				return ctx
			},
			run: func(ctx context.Context, _ string) error {
				<-ctx.Done()
				return ctx.Err()
			},
			want: ideminbox.Nack,
			is:   func(err error) bool { return errors.Is(err, context.DeadlineExceeded) },
			ran:  true,
		},
		{
			name: "store down at the claim",
			before: func(t *testing.T, _ *ideminbox.Inbox, _ string) context.Context {
				o.Down()
				return context.Background()
			},
			want:  ideminbox.Hold,
			is:    storeDown,
			after: func(*testing.T, string) { o.Up() },
		},
		{
			name: "store down under the handler, which fails",
			run: func(ctx context.Context, key string) error {
				o.Down()
				return o.Insert(ctx, inboxtest.Effects, key, "store down")
			},
			want:  ideminbox.Hold,
			is:    storeDown,
			ran:   true,
			after: func(*testing.T, string) { o.Up() },
		},
		{
			name: "store down after the handler succeeded",
			run: func(ctx context.Context, key string) error {
				if err := o.Insert(ctx, inboxtest.Effects, key, "lost with the commit"); err != nil {
					return err
				}
				o.Down()
				return nil
			},
			want:  ideminbox.Hold,
			is:    storeDown,
			ran:   true,
			after: func(*testing.T, string) { o.Up() },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := consumer(t, tc.engine)
			key := fmt.Sprintf("m-%d", time.Now().UnixNano())
			ctx := context.Background()
			if tc.before != nil {
				ctx = tc.before(t, in, key)
			}
			ran := false
			h := func(ctx context.Context) error {
				ran = true
				if tc.run == nil {
					t.Error("the handler ran")
					return nil
				}
				return tc.run(ctx, key)
			}
			msg := ideminbox.Message{ID: key, Attempt: 1}
			d, err := in.Process(ctx, msg, h)
			for i := range tc.holds {
				if !d.AwaitsStore(err) {
					t.Fatalf("run %d of delivery 1: %+v, %v; want held until the store answers", i+1, d, err)
				}
				if err := in.AwaitStore(ctx); err != nil {
					t.Fatal(err)
				}
				d, err = in.Process(ctx, msg, h)
			}
			if d.Action != tc.want || d.Delay != tc.delay || !tc.is(err) || ran != tc.ran {
				t.Fatalf("delivery 1: %+v, %v, handler ran: %v; want %v after %v, handler ran: %v", d, err, ran, tc.want, tc.delay, tc.ran)
			}
			if tc.last {
				return
			}
			if tc.after != nil {
				tc.after(t, key)
			}

			// The next delivery fails: poison if the first one counted.
			msg.Attempt = 2
			want := ideminbox.Nack
			if tc.counted {
				want = ideminbox.AckPoison
			}
			fails := func(context.Context) error { return errors.New("fails") }
			for {
				d, err = in.Process(context.Background(), msg, fails)
				if d.Action != ideminbox.Hold {
					break
				}
				if !errors.Is(err, idem.ErrInFlight) {
					t.Fatalf("delivery 2: held for %v", err)
				}
				time.Sleep(d.Delay)
			}
			if d.Action != want {
				t.Fatalf("delivery 2, the handler fails: %+v, %v; want %v (delivery 1 counted: %v)", d, err, want, tc.counted)
			}
		})
	}
	if rows := o.Rows(t, inboxtest.Effects); len(rows) != 0 {
		t.Errorf("effects %v, want none: every handler's writes were rolled back", rows)
	}
}

type cancelKey struct{}
