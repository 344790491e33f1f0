package idemredis

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/testenv"
)

var soak = flag.Duration("idemredis.soak", 0, "run TestSoak for this long (e.g. 30s); 0 skips it")

// TestSoak hammers a small set of keys from two engines on two clients for
// -idemredis.soak: handlers that succeed, fail (the key is released) or
// outlive a short lease (the key is taken over). Whatever the
// interleaving, each key is stored complete by exactly one execution, all
// replays return that execution's result, and no execution whose lease was
// lost reports success.
func TestSoak(t *testing.T) {
	if *soak <= 0 {
		t.Skip("skipping: set -idemredis.soak=30s to run")
	}
	prefix := testenv.Name()
	var engines [2]*idem.Engine
	for i := range engines {
		e, err := idem.NewEngine(newStoreOn(t, newClient(t, -1), prefix), &idem.Config{
			Lease:     200 * time.Millisecond,
			Heartbeat: -1, // let slow handlers lose their lease
		})
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = e
	}

	const keys, workers = 40, 32
	var (
		mu      sync.Mutex
		fresh   = map[string]string{} // key -> the body of the one fresh success
		counter atomic.Int64
	)
	ctx, cancel := context.WithTimeout(context.Background(), *soak)
	defer cancel()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				key := fmt.Sprint("k", rand.IntN(keys))
				op := idem.Operation{Tenant: "soak", Key: key, Fingerprint: []byte("fp")}
				body := fmt.Sprint(counter.Add(1))
				out, err := engines[w%2].Do(context.Background(), op, func(context.Context) (idem.Result, error) {
					switch rand.IntN(10) {
					case 0:
						return idem.Result{}, errors.New("handler failed")
					case 1:
						time.Sleep(300 * time.Millisecond) // past the lease
					default:
						time.Sleep(time.Duration(rand.IntN(5)) * time.Millisecond)
					}
					return idem.Result{Status: 201, Body: []byte(body)}, nil
				})
				switch {
				case err == nil && !out.Replayed:
					mu.Lock()
					if prev, ok := fresh[key]; ok {
						t.Errorf("key %s completed twice: %s and %s", key, prev, out.Result.Body)
					}
					fresh[key] = string(out.Result.Body)
					mu.Unlock()
				case err == nil:
					mu.Lock()
					want, ok := fresh[key]
					mu.Unlock()
					// The replay may race ahead of the fresh answer's
					// bookkeeping; only a known answer can be compared.
					if ok && want != string(out.Result.Body) {
						t.Errorf("key %s replayed %s, stored %s", key, out.Result.Body, want)
					}
				case errors.Is(err, idem.ErrInFlight), errors.Is(err, idem.ErrLeaseLost), err.Error() == "handler failed":
				default:
					t.Errorf("Do: %v", err)
				}
			}
		})
	}
	wg.Wait()
	for key, body := range fresh {
		rec, err := engines[0].Store().Get(context.Background(), "soak", key)
		if err != nil || string(rec.Result.Body) != body {
			t.Errorf("key %s: stored %+v %v, want body %s", key, rec, err, body)
		}
	}
	t.Logf("%d calls, %d keys completed", counter.Load(), len(fresh))
}
