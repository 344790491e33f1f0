package reliability

import (
	"context"
	"fmt"
	"github.com/idem-go/idem/internal/tcpproxy"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// TestStoreOutage (PostgreSQL): while workers send orders, each retrying
// its key until it gets a 201, the database becomes unreachable (the
// process's pool dials it through a Proxy, which is cut: live connections
// die, new ones fail), then comes back; then the pool's server backends
// are terminated, three times, under load.
//
// It checks that requests during the cut get 503 problem+json with
// Retry-After, that no handler ran without a won claim, that nothing is
// half-written (every order has its completed record and the reverse, no
// record in flight, every key's answers identical), and that service
// resumes by itself: the same process, untouched, serves every key to
// completion after the store returns.
//
// Mutant fail-open (a failed claim counts as won) makes handlers run
// without a claim, and fails this test.
func TestStoreOutage(t *testing.T) {
	db := newPostgres(t)
	proxy, err := tcpproxy.NewProxy(db.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	// A short lease: a key whose release failed during the outage is
	// free again soon after. ReleaseOn5xx: the handler's own 503 (its
	// write failed) is not stored, so the retry runs again.
	s := newStack(t, db, stackConfig{
		engine: idem.Config{Lease: time.Second},
		http:   idemhttp.Config{ReleaseOn5xx: true},
		via:    proxy.Addr(),
	})
	ctx := context.Background()

	var (
		j           journal
		stop        atomic.Bool
		done        atomic.Int64 // keys that got their 201
		unavailable atomic.Int64 // 503 store-unavailable answers
		noRetry     atomic.Int64 // 503s without Retry-After
		wg          sync.WaitGroup
	)
	const workers = 6
	for w := range workers {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("w%d-%d", w, i)
				item := fmt.Sprintf("item %d/%d", w, i)
				deadline := time.Now().Add(time.Minute) // patience, not an assertion
				for time.Now().Before(deadline) {
					a := j.send(ctx, 0, s, "acme", key, item)
					if a.status == http.StatusCreated {
						done.Add(1)
						break
					}
					if a.status == http.StatusServiceUnavailable {
						if a.problem() == "store-unavailable" {
							unavailable.Add(1)
						}
						if a.header.Get("Retry-After") == "" {
							noRetry.Add(1)
						}
					}
					if a.err != nil || a.problem() == "" {
						return // checkInvariants reports it
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	waitDone := func(what string, n int64) {
		t.Helper()
		eventually(t, what, func() bool { return done.Load() >= n })
	}

	waitDone("the first orders", 30)
	proxy.Cut()
	before := unavailable.Load()
	eventually(t, "503 answers during the cut", func() bool { return unavailable.Load() >= before+20 })
	atCut := done.Load()
	proxy.Restore()
	waitDone("orders after the store came back", atCut+30)
	terminated := 0
	for range 3 {
		n, err := db.terminate(ctx, s.conn.app)
		if err != nil {
			t.Fatal(err)
		}
		terminated += n
		waitDone("orders after the backends were terminated", done.Load()+20)
	}
	stop.Store(true)
	wg.Wait()

	tl := checkInvariants(t, db, j.all(), s.entries, []*countingStore{s.store}, checkRules{
		problems: map[string]bool{
			"store-unavailable": true, // the claim, begin or completion failed
			"in-flight":         true, // a claim committed but its answer lost: held until the lease ends
			"lease-lost":        true, // a completion that could not extend past the lease
			"https://example.test/problems/order-write-failed": true, // the handler's own write failed
		},
		allDone: true,
	})
	if unavailable.Load() == 0 {
		t.Error("no request was answered 503 store-unavailable during the cut")
	}
	if noRetry.Load() > 0 {
		t.Errorf("%d answers 503 without Retry-After", noRetry.Load())
	}
	t.Logf("cut once, %d backends terminated over three rounds; %v", terminated, tl)
}
