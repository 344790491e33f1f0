package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// endsAtCheck is a context that ends itself the moment its Err is called
// for the at-th time, while still answering nil that time: the caller of
// Claim gives up right after the store has looked at its context and
// before it has looked again.
type endsAtCheck struct {
	context.Context
	cancel context.CancelFunc
	calls  atomic.Int32
	at     int32
}

func (c *endsAtCheck) Err() error {
	err := c.Context.Err()
	if c.calls.Add(1) == c.at {
		c.cancel()
	}
	return err
}

// A claim either comes back won, or its key is not left in flight: a
// caller that gives up while its claim runs (the statement may commit
// before the store notices) must not lock the key until the lease ends.
// The store marks the claims it knows did not take effect
// (idem.ErrNotApplied); the engine releases the others, fenced by their
// token. Two ways to give up: a deadline drawn between 0 and 1.5ms, and a
// context that ends between two of the store's looks at it, at each look
// in turn.
func TestCancelledClaimLeavesNoKeyHeld(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 4, mode.config)
			engine, err := idem.NewEngine(e.store, &idem.Config{Lease: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			type attempt struct {
				key    string
				failed bool
			}
			var attempts []attempt
			do := func(c context.Context, key string) error {
				_, err := engine.Do(c, idem.Operation{Tenant: "t", Key: key}, func(context.Context) (idem.Result, error) {
					return idem.Result{Status: 201}, nil
				})
				return err
			}
			for i := range 150 {
				c, cancel := context.WithTimeout(ctx, time.Duration(rand.Int64N(int64(1500*time.Microsecond))))
				key := fmt.Sprintf("deadline-%d", i)
				attempts = append(attempts, attempt{key, do(c, key) != nil})
				cancel()
			}
			// Forty at one barrier, all giving up at one instant: whole
			// batches fail together, and each of their claims must be
			// released promptly, not one after another's schedule.
			for round := range 4 {
				c, cancel := context.WithTimeout(ctx, time.Duration(rand.Int64N(int64(3*time.Millisecond))))
				keys := make([]string, 40)
				errs := make([]error, 40)
				atonce.Run(40, func(i int) {
					keys[i] = fmt.Sprintf("together%d-%d", round, i)
					errs[i] = do(c, keys[i])
				})
				cancel()
				for i := range keys {
					attempts = append(attempts, attempt{keys[i], errs[i] != nil})
				}
			}
			for at := int32(1); at <= 4; at++ {
				for i := range 25 {
					c, cancel := context.WithCancel(ctx)
					key := fmt.Sprintf("check%d-%d", at, i)
					attempts = append(attempts, attempt{key, do(&endsAtCheck{Context: c, cancel: cancel, at: at}, key) != nil})
					cancel()
				}
			}
			failed := 0
			for _, a := range attempts {
				if !a.failed {
					continue
				}
				failed++
				// The release runs after Do has returned, within seconds
				// (the lease is an hour).
				waitFor(t, "the release of "+a.key, func() bool {
					rec, err := e.store.Get(ctx, "t", a.key)
					return errors.Is(err, idem.ErrNotFound) || err == nil && rec.State != idem.StateInFlight
				})
			}
			t.Logf("%d operations, %d given up", len(attempts), failed)
			if err := engine.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
	}
}

// A store whose database cannot be reached marks its failed claims
// idem.ErrNotApplied, so that the engine schedules no release for them:
// nothing was sent, and a database coming back must not meet a pile of
// releases.
func TestUnreachableDatabaseStartsNoRelease(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			store := testenv.Must(idempg.NewStore(pool, mode.config))
			for i := range 20 {
				_, err := store.Claim(context.Background(), idem.ClaimParams{Tenant: "t", Key: fmt.Sprintf("k%d", i), Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour})
				if err == nil {
					t.Fatal("a claim succeeded against a closed port")
				}
				if !errors.Is(err, idem.ErrNotApplied) {
					t.Fatalf("claim never sent = %v, not marked idem.ErrNotApplied: the engine would schedule releases for it", err)
				}
			}
		})
	}
}
