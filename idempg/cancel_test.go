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
	"github.com/idem-go/idem/internal/lateclaim"
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

// A claim either comes back won, or its key is not left in flight under
// its token: a caller that gives up while its claim runs (the statement
// may commit before the store notices) must not lock the key until the
// lease ends. Two ways to give up: a deadline drawn between 0 and 1.5ms,
// and a context that ends between two of the store's looks at it, at each
// look in turn.
func TestCancelledClaimLeavesNoKeyHeld(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 4, mode.config)
			ctx := context.Background()
			type attempt struct {
				key   string
				token int64
				won   bool
			}
			var attempts []attempt
			claim := func(c context.Context, key string) {
				token := rand.Int64N(1<<62) + 1
				res, err := e.store.Claim(c, idem.ClaimParams{Tenant: "t", Key: key, Token: token, Lease: time.Hour, Retention: time.Hour})
				if err == nil && !res.Won {
					t.Fatalf("claim of the fresh key %s lost: %+v", key, res)
				}
				attempts = append(attempts, attempt{key, token, err == nil})
			}
			for i := range 150 {
				c, cancel := context.WithTimeout(ctx, time.Duration(rand.Int64N(int64(1500*time.Microsecond))))
				claim(c, fmt.Sprintf("deadline-%d", i))
				cancel()
			}
			// Forty at one barrier, all giving up at one instant: whole
			// batches fail together, and each of their claims must be
			// released promptly, not one after another's schedule.
			for round := range 4 {
				c, cancel := context.WithTimeout(ctx, time.Duration(rand.Int64N(int64(3*time.Millisecond))))
				keys := make([]string, 40)
				tokens := make([]int64, 40)
				errs := make([]error, 40)
				atonce.Run(40, func(i int) {
					keys[i] = fmt.Sprintf("together%d-%d", round, i)
					tokens[i] = rand.Int64N(1<<62) + 1
					_, errs[i] = e.store.Claim(c, idem.ClaimParams{Tenant: "t", Key: keys[i], Token: tokens[i], Lease: time.Hour, Retention: time.Hour})
				})
				cancel()
				for i := range keys {
					attempts = append(attempts, attempt{keys[i], tokens[i], errs[i] == nil})
				}
			}
			for at := int32(1); at <= 4; at++ {
				for i := range 25 {
					c, cancel := context.WithCancel(ctx)
					claim(&endsAtCheck{Context: c, cancel: cancel, at: at}, fmt.Sprintf("check%d-%d", at, i))
					cancel()
				}
			}
			failed := 0
			for _, a := range attempts {
				if a.won {
					continue
				}
				failed++
				// The release runs after the claim has returned, within
				// seconds (the lease is an hour).
				waitFor(t, "the release of "+a.key, func() bool {
					rec, err := e.store.Get(ctx, "t", a.key)
					return errors.Is(err, idem.ErrNotFound) || err == nil && rec.LeaseToken != a.token
				})
			}
			t.Logf("%d claims, %d given up before they were answered", len(attempts), failed)
		})
	}
}

// One claim the database would refuse (a tenant that is not UTF-8, a key
// with a NUL byte) is refused alone, before any statement: it does not
// fail the claims batched with it.
func TestBadClaimFailsAlone(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newEnvWith(t, 4, mode.config)
			ctx := context.Background()
			const n = 40
			errs := make([]error, n)
			bad := func(i int) bool { return i%10 == 3 }
			atonce.Run(n, func(i int) {
				p := idem.ClaimParams{Tenant: "good", Key: fmt.Sprintf("k%d", i), Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour}
				switch {
				case i%20 == 3:
					p.Tenant = "bad\xff"
				case bad(i):
					p.Key = "nul\x00"
				}
				_, errs[i] = e.store.Claim(ctx, p)
			})
			for i, err := range errs {
				switch {
				case bad(i) && err == nil:
					t.Errorf("claim %d, with a tenant or key PostgreSQL refuses, succeeded", i)
				case !bad(i) && err != nil:
					t.Errorf("good claim %d failed: %v", i, err)
				}
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

// A store whose database cannot be reached starts no release for its
// failed claims: nothing was sent, and a database coming back must not
// meet a pile of releases.
func TestUnreachableDatabaseStartsNoRelease(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) {
			pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/test?connect_timeout=1")
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			store := idempg.NewWithConfig(pool, mode.config)
			before := lateclaim.Started()
			for i := range 20 {
				_, err := store.Claim(context.Background(), idem.ClaimParams{Tenant: "t", Key: fmt.Sprintf("k%d", i), Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour})
				if err == nil {
					t.Fatal("a claim succeeded against a closed port")
				}
			}
			if n := lateclaim.Started() - before; n != 0 {
				t.Fatalf("%d releases started for claims that were never sent", n)
			}
		})
	}
}
