package idemredis

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// TestClaimWithLostReplyReleases: claims that ran on the server while
// their client never learned it (the reply was lost and the read timed
// out, or the connection ended before the reply) do not leave their keys
// held. The store does not mark such an error idem.ErrNotApplied, so the
// engine releases the keys, fenced by the token, through the same client,
// whose reads time out. Each claim is sent once: a resend could end in a
// refusal that hides the first attempt, and the proxy counts what
// reached the server.
func TestClaimWithLostReplyReleases(t *testing.T) {
	for _, mode := range []struct {
		name string
		mode faultMode
	}{{"reply lost", drop}, {"connection cut", cut}} {
		t.Run(mode.name, func(t *testing.T) {
			ctx := context.Background()
			opt, err := redis.ParseURL(testenv.RedisURL(t))
			if err != nil {
				t.Fatal(err)
			}
			const fp = "lost-reply-fingerprint"
			proxy := startFaultProxy(t, opt.Addr, fp, mode.mode)
			prefix := testenv.Name()
			reader := newStoreOn(t, newClient(t, -1), prefix)
			// The claim script is loaded by a client that gets its replies,
			// so that the lossy one sends EVALSHA and never EVAL.
			if _, err := reader.Claim(ctx, claimParams("t", "warm-up", "fp", 1)); err != nil {
				t.Fatal(err)
			}
			lossyOpt := *opt
			lossyOpt.Addr = proxy.addr
			// go-redis's default resends stay on: the claim must not use them.
			// Long enough for a handshake on a busy machine: the replies it
			// waits for in vain are the claims'.
			lossyOpt.ReadTimeout, lossyOpt.PoolSize = 2*time.Second, 64
			lossy := redis.NewClient(&lossyOpt)
			t.Cleanup(func() { _ = lossy.Close() })
			const n = 20
			// n connections, opened and greeted (HELLO) before any reply
			// is lost, so that every claim below is written on one: a
			// handshake that timed out on a busy machine would fail its
			// claim before sending it.
			conns := make([]*redis.Conn, n)
			for i := range conns {
				conns[i] = lossy.Conn()
				if err := conns[i].Ping(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range conns {
				_ = c.Close() // back to the pool, open
			}
			engine, err := idem.NewEngine(newUniversalStore(t, lossy, prefix), nil)
			if err != nil {
				t.Fatal(err)
			}

			errs := make([]error, n)
			atonce.Run(n, func(i int) {
				_, errs[i] = engine.Do(ctx, idem.Operation{Tenant: "t", Key: fmt.Sprint("lost-", i), Fingerprint: []byte(fp)},
					func(context.Context) (idem.Result, error) {
						return idem.Result{Status: 201}, nil
					})
			})
			for i, err := range errs {
				if !errors.Is(err, idem.ErrStore) || errors.Is(err, idem.ErrNotApplied) {
					t.Fatalf("claim %d whose reply was lost: %v, want a store error not marked ErrNotApplied", i, err)
				}
			}
			if got := proxy.marked.Load(); got != n {
				t.Fatalf("%d claims reached the server for %d calls, want one each", got, n)
			}
			for i := range n {
				key := fmt.Sprint("lost-", i)
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
					rec, err := reader.Get(ctx, "t", key)
					if errors.Is(err, idem.ErrNotFound) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s still held (%s) under token %d after its claim failed", key, rec.State, rec.LeaseToken)
					}
				}
			}
			proxy.setMode(pass)
			if err := engine.Close(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
