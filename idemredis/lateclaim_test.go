package idemredis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/redis/go-redis/v9"
)

// A claim whose reply is lost (the read times out after the script was
// sent; the server runs it all the same) does not leave the key held: the
// store does not mark the error idem.ErrNotApplied, so the engine
// releases it, fenced by the token.
func TestClaimWithLostReplyReleases(t *testing.T) {
	opt, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Every reply arrives too late; no resend, which would hide the loss.
	opt.ReadTimeout, opt.MaxRetries = time.Microsecond, -1
	impatient := redis.NewClient(opt)
	t.Cleanup(func() { _ = impatient.Close() })
	checker := newClient(t, -1)
	prefix := testenv.Name()
	lossy := &Store{client: impatient, prefix: prefix}
	reader := newStoreOn(t, checker, prefix)
	// The scripts are loaded by a client that waits, so that the lossy one
	// sends EVALSHA and never has to fall back.
	if _, err := reader.Claim(context.Background(), claimParams("t", "warm-up", "fp", 1)); err != nil {
		t.Fatal(err)
	}

	engine, err := idem.NewEngine(lossy, nil)
	if err != nil {
		t.Fatal(err)
	}
	lost := 0
	for i := range 20 {
		key := "lost-" + string(rune('a'+i))
		_, err := engine.Do(context.Background(), idem.Operation{Tenant: "t", Key: key, Fingerprint: []byte("fp")}, func(context.Context) (idem.Result, error) {
			return idem.Result{Status: 201}, nil
		})
		if err == nil {
			continue // the reply made it after all
		}
		lost++
		deadline := time.Now().Add(10 * time.Second)
		for {
			rec, err := reader.Get(context.Background(), "t", key)
			if errors.Is(err, idem.ErrNotFound) || err == nil && rec.State != idem.StateInFlight {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still held (%s) under token %d after its claim failed", key, rec.State, rec.LeaseToken)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if lost == 0 {
		t.Fatal("no reply was lost: the test proved nothing")
	}
}
