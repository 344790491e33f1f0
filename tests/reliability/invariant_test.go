package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestInvariants runs a short mixed workload on each store and checks
// every recorded exchange against the invariants (see checkInvariants):
// one execution per (tenant, key), byte-identical successful answers,
// every order traceable to exactly one key, nothing left in flight.
//
// Mutant claim-wins (the store reports lost claims as won) fails it.
func TestInvariants(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *database) {
		w := newWorkload(t, db)
		w.run(t, func(n int) bool { return n < 100 })
		t.Logf("%s: %v", db.name, w.check(t))
	})
}

// TestInvariantSoak is TestInvariants for -reliability.soak per store,
// with thousands of keys:
//
//	go test ./tests/reliability/ -run 'TestInvariantSoak/postgres' -reliability.soak=2m -v
func TestInvariantSoak(t *testing.T) {
	if *soakFlag <= 0 {
		t.Skip("soak off; run with -reliability.soak=2m")
	}
	eachDatabase(t, func(t *testing.T, db *database) {
		w := newWorkload(t, db)
		end := time.Now().Add(*soakFlag)
		w.run(t, func(int) bool { return time.Now().Before(end) })
		t.Logf("%s: %v", db.name, w.check(t))
	})
}

// workload is a mixed load from two tenants on two processes sharing one
// database:
//
//   - fresh: one request with a new key;
//   - duplicates: six identical requests released at one barrier, spread
//     over both processes;
//   - cross-tenant: the same new key sent by both tenants at one barrier;
//   - racing mismatch: a new key sent at one barrier with two different
//     bodies: one of them runs, the other gets 422;
//   - late retry: a completed key sent again, to either process;
//   - mismatch: a completed key reused with another body.
//
// Clients retry 409 in-flight answers until they get a final one, as
// idemclient does. Each unit also checks its own expectation (a late retry
// is a replay, a mismatch is 422); checkInvariants checks the whole.
type workload struct {
	db    *database
	procs []*stack
	ent   *entries
	j     journal
	keys  atomic.Int64
	mu    sync.Mutex
	done  []exchange // one completed request per key, for late retries
}

var tenants = []string{"acme", "globex"}

func newWorkload(t *testing.T, db *database) *workload {
	w := &workload{db: db, ent: newEntries()}
	for range 2 {
		w.procs = append(w.procs, newStack(t, db, stackConfig{shared: w.ent}))
	}
	return w
}

// run drains units on eight workers while more(n) holds for the n-th unit.
func (w *workload) run(t *testing.T, more func(n int) bool) {
	units := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for kind := range units {
				w.unit(t, kind)
			}
		})
	}
	for n := 0; more(n); n++ {
		units <- rand.IntN(10)
	}
	close(units)
	wg.Wait()
	// Every key once more, late, on the other process than the first
	// answer came from: a replay.
	w.mu.Lock()
	done := append([]exchange(nil), w.done...)
	w.mu.Unlock()
	for _, e := range done {
		w.late(t, e)
	}
}

func (w *workload) newKey() string { return fmt.Sprintf("key-%d", w.keys.Add(1)) }

// final sends one request, retrying 409 in-flight answers.
func (w *workload) final(ctx context.Context, proc int, tenant, key, item string) answer {
	for range 10000 {
		a := w.j.send(ctx, proc, w.procs[proc], tenant, key, item)
		if a.status != http.StatusConflict || a.problem() != "in-flight" {
			return a
		}
		time.Sleep(time.Duration(1+rand.IntN(5)) * time.Millisecond)
	}
	return answer{err: fmt.Errorf("(%s, %s) still in flight after 10000 tries", tenant, key)}
}

func (w *workload) completed(a answer, proc int, tenant, key, item string) {
	if a.status == http.StatusCreated {
		w.mu.Lock()
		w.done = append(w.done, exchange{proc: proc, tenant: tenant, key: key, item: item, a: a})
		w.mu.Unlock()
	}
}

// burst sends the requests at one barrier and returns their final answers.
func (w *workload) burst(reqs []exchange) []answer {
	ctx := context.Background()
	barrier := make(chan struct{})
	out := make([]answer, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		wg.Go(func() {
			<-barrier
			out[i] = w.final(ctx, r.proc, r.tenant, r.key, r.item)
		})
	}
	close(barrier)
	wg.Wait()
	return out
}

func (w *workload) unit(t *testing.T, kind int) {
	ctx := context.Background()
	tenant := tenants[rand.IntN(2)]
	switch kind {
	case 0, 1, 2: // fresh
		key, proc := w.newKey(), rand.IntN(2)
		item := "item-" + key
		w.completed(w.final(ctx, proc, tenant, key, item), proc, tenant, key, item)
	case 3, 4: // duplicates at one barrier, over both processes
		key := w.newKey()
		var reqs []exchange
		for i := range 6 {
			reqs = append(reqs, exchange{proc: i % 2, tenant: tenant, key: key, item: "item-" + key})
		}
		for i, a := range w.burst(reqs) {
			w.completed(a, reqs[i].proc, tenant, key, reqs[i].item)
		}
	case 5: // the same key from both tenants at one barrier
		key := w.newKey()
		var reqs []exchange
		for i := range 6 {
			reqs = append(reqs, exchange{proc: i % 2, tenant: tenants[i%2], key: key, item: "item-" + key})
		}
		for i, a := range w.burst(reqs) {
			w.completed(a, reqs[i].proc, reqs[i].tenant, key, reqs[i].item)
		}
	case 6: // racing mismatch: two bodies under one key at one barrier
		key := w.newKey()
		var reqs []exchange
		for i := range 5 {
			reqs = append(reqs, exchange{proc: i % 2, tenant: tenant, key: key, item: fmt.Sprintf("item-%s-%d", key, i%2)})
		}
		for i, a := range w.burst(reqs) {
			w.completed(a, reqs[i].proc, tenant, key, reqs[i].item)
		}
	case 7, 8: // late retry of a completed key
		if e, ok := w.pick(); ok {
			w.late(t, e)
		}
	case 9: // mismatch on a completed key
		if e, ok := w.pick(); ok {
			a := w.final(ctx, rand.IntN(2), e.tenant, e.key, e.item+"-other")
			if a.status != http.StatusUnprocessableEntity || a.problem() != "fingerprint-mismatch" {
				t.Errorf("(%s, %s) reused with another body: %v, want 422", e.tenant, e.key, a)
			}
		}
	}
}

func (w *workload) pick() (exchange, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.done) == 0 {
		return exchange{}, false
	}
	return w.done[rand.IntN(len(w.done))], true
}

// late resends a completed request to the other process.
func (w *workload) late(t *testing.T, e exchange) {
	a := w.final(context.Background(), 1-e.proc, e.tenant, e.key, e.item)
	if a.status != http.StatusCreated || !a.replayed() {
		t.Errorf("(%s, %s) late retry: %v, want a replay", e.tenant, e.key, a)
	}
}

func (w *workload) check(t *testing.T) tally {
	var stores []*countingStore
	for _, p := range w.procs {
		stores = append(stores, p.store)
	}
	return checkInvariants(t, w.db, w.j.all(), w.ent, stores, checkRules{
		problems:    map[string]bool{"in-flight": true, "fingerprint-mismatch": true},
		exactlyOnce: true,
		allDone:     true,
	})
}
