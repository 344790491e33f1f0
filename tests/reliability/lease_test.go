package reliability

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// gate holds handlers until opened. Tests defer its opening, so that a
// failing test never leaves a handler blocked and its server's Close
// waiting for it (deferred calls run before the test's cleanups).
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// slowFirst returns a hook that holds the first execution, after its order
// is written in its transaction, until release opens; started is closed
// when it gets there.
func slowFirst(started chan struct{}, release *gate) func(http.ResponseWriter, *http.Request, order, int64) bool {
	var n atomic.Int64
	return func(w http.ResponseWriter, r *http.Request, o order, id int64) bool {
		if n.Add(1) == 1 {
			close(started)
			<-release.ch
		}
		return false
	}
}

// TestLeaseLostTakeover (PostgreSQL): with the heartbeat off, a handler
// slower than its lease, in one process, is taken over by a retry sent to
// another process. When the slow handler finally finishes, its commit is
// refused by the fence: it answers 409 lease-lost, its order is rolled
// back, and exactly one order exists, the takeover's, whose answer is the
// one replayed from then on.
//
// Mutant unfenced-write (the handler commits its order on a connection of
// its own) leaves two orders, and fails this test.
func TestLeaseLostTakeover(t *testing.T) {
	db := newPostgres(t)
	ctx := context.Background()
	started, release := make(chan struct{}), newGate()
	defer release.open()
	shared := newEntries()
	cfg := idem.Config{Lease: 500 * time.Millisecond, Heartbeat: -1}
	slowProc := newStack(t, db, stackConfig{engine: cfg, shared: shared, hook: slowFirst(started, release)})
	retryProc := newStack(t, db, stackConfig{engine: cfg, shared: shared})

	slow := make(chan answer, 1)
	go func() { slow <- slowProc.order(ctx, "acme", "lease-1", "tea") }()
	<-started

	// Retry, as a client would, until the lease has run out on the
	// store's clock and the retry takes the key over.
	var takeover answer
	inFlight := 0
	eventually(t, "a takeover", func() bool {
		takeover = retryProc.order(ctx, "acme", "lease-1", "tea")
		if takeover.status == http.StatusConflict && takeover.problem() == "in-flight" {
			inFlight++
			return false
		}
		return true
	})
	if takeover.status != http.StatusCreated || takeover.replayed() {
		t.Fatalf("takeover answered %v, want a fresh 201", takeover)
	}
	// Not asserted: on a starved machine the lease may end before the
	// first retry. That a live lease holds the key is TestHeartbeatKeepsKey's.
	t.Logf("%d retries met the key in flight before the takeover", inFlight)

	release.open()
	wantProblem(t, <-slow, http.StatusConflict, "lease-lost")

	orders := db.ordersOf(t, "acme", "lease-1")
	if len(orders) != 1 || orders[0].id != idOf(t, takeover) {
		t.Fatalf("orders %v, want exactly the takeover's (id %d)", orders, idOf(t, takeover))
	}
	if n := shared.get("acme", "lease-1"); n != 2 {
		t.Fatalf("handler entered %d times, want 2 (the slow one and the takeover)", n)
	}
	for _, p := range []*stack{slowProc, retryProc} {
		replay := p.order(ctx, "acme", "lease-1", "tea")
		if replay.status != http.StatusCreated || !replay.replayed() || !bytes.Equal(replay.body, takeover.body) {
			t.Fatalf("replay %v, want the takeover's answer %q", replay, takeover.body)
		}
	}
	wantNoneInFlight(t, db)
}

// TestLeaseLostBurst (PostgreSQL): the same lost lease, but once it has
// ended on the server's clock, eight retries arrive at the same instant,
// half on each process. Exactly one takes the key over; the others meet it
// in flight and, retrying, get its answer replayed; the slow handler's
// commit is refused. Checked by checkInvariants: one order, identical
// answers, no handler without a won claim, nothing in flight.
func TestLeaseLostBurst(t *testing.T) {
	db := newPostgres(t)
	ctx := context.Background()
	started, release := make(chan struct{}), newGate()
	defer release.open()
	shared := newEntries()
	cfg := idem.Config{Lease: 300 * time.Millisecond, Heartbeat: -1}
	procs := []*stack{
		newStack(t, db, stackConfig{engine: cfg, shared: shared, hook: slowFirst(started, release)}),
		newStack(t, db, stackConfig{engine: cfg, shared: shared}),
	}
	var j journal
	slow := make(chan answer, 1)
	go func() { slow <- j.send(ctx, 0, procs[0], "acme", "burst-1", "tea") }()
	<-started
	eventually(t, "the lease to end on the server's clock", func() bool {
		var ended bool
		if err := db.check.QueryRowContext(ctx, `SELECT now() > locked_until FROM idem_keys WHERE idem_key = 'burst-1'`).Scan(&ended); err != nil {
			t.Fatal(err)
		}
		return ended
	})
	barrier := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			<-barrier
			// Bounded, and no t.Fatal off the test goroutine: a request
			// still in flight at the end fails checkInvariants (allDone).
			for range 10000 {
				a := j.send(ctx, i%2, procs[i%2], "acme", "burst-1", "tea")
				if a.status != http.StatusConflict || a.problem() != "in-flight" {
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	close(barrier)
	wg.Wait()
	release.open()
	wantProblem(t, <-slow, http.StatusConflict, "lease-lost")

	tl := checkInvariants(t, db, j.all(), shared, []*countingStore{procs[0].store, procs[1].store}, checkRules{
		problems: map[string]bool{"in-flight": true, "lease-lost": true},
		allDone:  true,
	})
	if tl.fresh != 1 || tl.orders != 1 {
		t.Errorf("%d fresh answers and %d orders, want one takeover", tl.fresh, tl.orders)
	}
	if n := shared.get("acme", "burst-1"); n != 2 {
		t.Errorf("handler entered %d times, want 2 (the slow one and the takeover)", n)
	}
	t.Log(tl)
}

// TestHeartbeatKeepsKey (PostgreSQL): with the heartbeat on, the same slow
// handler keeps its key however long it runs. Retries from another
// process, sent until the store's clock is a whole lease past the first
// lease end, all get 409 in-flight; the slow handler commits, and the
// retry after it gets its answer replayed.
//
// Mutant heartbeat-off runs this without a heartbeat: a retry takes over
// and the test fails.
func TestHeartbeatKeepsKey(t *testing.T) {
	db := newPostgres(t)
	ctx := context.Background()
	// Twenty beats per lease: a beat delayed on a loaded machine must not
	// pass for a takeover.
	const lease = time.Second
	cfg := idem.Config{Lease: lease, Heartbeat: 50 * time.Millisecond}
	if mutant("heartbeat-off") {
		cfg.Heartbeat = -1
	}
	started, release := make(chan struct{}), newGate()
	defer release.open()
	shared := newEntries()
	slowProc := newStack(t, db, stackConfig{engine: cfg, shared: shared, hook: slowFirst(started, release)})
	retryProc := newStack(t, db, stackConfig{engine: cfg, shared: shared})

	slow := make(chan answer, 1)
	go func() { slow <- slowProc.order(ctx, "acme", "beat-1", "tea") }()
	<-started
	rec, err := slowProc.conn.store.Get(ctx, "acme", "beat-1")
	if err != nil {
		t.Fatal(err)
	}
	// A whole lease past the first lease end, on the store's clock:
	// without the heartbeat, the key could have been taken over twice.
	horizon := rec.LockedUntil.Add(lease)
	retries := 0
	eventually(t, "the store's clock to pass two leases", func() bool {
		a := retryProc.order(ctx, "acme", "beat-1", "tea")
		retries++
		if a.status != http.StatusConflict || a.problem() != "in-flight" {
			t.Fatalf("retry %d answered %v while the slow handler was alive, want 409 in-flight", retries, a)
		}
		var past bool
		if err := db.check.QueryRowContext(ctx, `SELECT now() > $1`, horizon).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
	release.open()
	first := <-slow
	if first.status != http.StatusCreated || first.replayed() {
		t.Fatalf("slow handler answered %v, want its fresh 201", first)
	}
	replay := retryProc.order(ctx, "acme", "beat-1", "tea")
	if !replay.replayed() || !bytes.Equal(replay.body, first.body) {
		t.Fatalf("replay %v, want %q", replay, first.body)
	}
	if n := shared.get("acme", "beat-1"); n != 1 {
		t.Fatalf("handler entered %d times, want 1", n)
	}
	if o := db.ordersOf(t, "acme", "beat-1"); len(o) != 1 {
		t.Fatalf("%d orders, want 1", len(o))
	}
	t.Logf("%d retries met the key in flight", retries)
}

// TestLeaseSQLite: on SQLite the slow handler's transaction holds the
// database's single write lock (BEGIN IMMEDIATE) for as long as it runs,
// so a retry's claim cannot even read-and-write the record: it waits for
// the lock (up to idemsqlite.BusyTimeout). The lease therefore cannot
// be lost under a live handler, heartbeat or not: when the slow handler
// commits, its completion is not refused, and the waiting retry then
// finds the key complete and gets the replay. This test pins that down,
// with the retry in a second process on the same file: a takeover there
// would be a second execution.
func TestLeaseSQLite(t *testing.T) {
	for _, hb := range []time.Duration{-1, 50 * time.Millisecond} {
		name := map[bool]string{true: "heartbeat-off", false: "heartbeat-on"}[hb < 0]
		t.Run(name, func(t *testing.T) {
			db := newSQLite(t)
			ctx := context.Background()
			cfg := idem.Config{Lease: 300 * time.Millisecond, Heartbeat: hb}
			started, release := make(chan struct{}), newGate()
			defer release.open()
			shared := newEntries()
			slowProc := newStack(t, db, stackConfig{engine: cfg, shared: shared, hook: slowFirst(started, release)})
			retryProc := newStack(t, db, stackConfig{engine: cfg, shared: shared})

			slow := make(chan answer, 1)
			go func() { slow <- slowProc.order(ctx, "acme", "lease-1", "tea") }()
			<-started
			// Reads go on beside the writer (WAL): wait until the lease has
			// ended on the database's clock.
			eventually(t, "the lease to end", func() bool {
				var ended bool
				err := db.check.QueryRowContext(ctx, `SELECT locked_until < CAST(round(unixepoch('subsec') * 1000000) AS INTEGER) FROM idem_keys WHERE idem_key = 'lease-1'`).Scan(&ended)
				if err != nil {
					t.Fatal(err)
				}
				return ended
			})
			retry := make(chan answer, 1)
			go func() { retry <- retryProc.order(ctx, "acme", "lease-1", "tea") }()
			// The retry is now inside its claim, waiting for the lock.
			eventually(t, "the retry to reach its claim", func() bool { return retryProc.store.inClaim() > 0 })
			release.open()

			first := <-slow
			if first.status != http.StatusCreated || first.replayed() {
				t.Fatalf("slow handler answered %v, want its fresh 201: nothing could take its key over", first)
			}
			second := <-retry
			if second.status != http.StatusCreated || !second.replayed() || !bytes.Equal(second.body, first.body) {
				t.Fatalf("retry answered %v, want the replay of %q", second, first.body)
			}
			if n := shared.get("acme", "lease-1"); n != 1 {
				t.Fatalf("handler entered %d times, want 1", n)
			}
			if o := db.ordersOf(t, "acme", "lease-1"); len(o) != 1 {
				t.Fatalf("%d orders, want 1", len(o))
			}
		})
	}
}

// TestLeaseSQLiteDeadClaimant: where a lease does matter on SQLite is a
// process that died after its claim (its transaction, and so the lock,
// died with it). A retry meets the key in flight until the lease ends on
// the database's clock, then takes it over and runs; the dead execution's
// token can no longer complete, even if its owner came back.
func TestLeaseSQLiteDeadClaimant(t *testing.T) {
	db := newSQLite(t)
	ctx := context.Background()
	cfg := idem.Config{Lease: 300 * time.Millisecond, Heartbeat: -1}
	proc := newStack(t, db, stackConfig{engine: cfg})
	fp := fingerprintOf(t, proc, "acme", "dead-1", "tea")
	const deadToken = 42
	res, err := proc.conn.store.Claim(ctx, idem.ClaimParams{Tenant: "acme", Key: "dead-1", Fingerprint: fp, Token: deadToken, Lease: cfg.Lease, Retention: time.Hour})
	if err != nil || !res.Won {
		t.Fatalf("claim: %v %+v", err, res)
	}
	inFlight := 0
	var a answer
	eventually(t, "a takeover", func() bool {
		a = proc.order(ctx, "acme", "dead-1", "tea")
		if a.status == http.StatusConflict && a.problem() == "in-flight" {
			inFlight++
			return false
		}
		return true
	})
	if a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("after %d in-flight answers: %v, want a fresh 201", inFlight, a)
	}
	tx, err := proc.conn.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	err = tx.Complete(ctx, idem.CompleteParams{Tenant: "acme", Key: "dead-1", Token: deadToken, Result: idem.Result{Status: 201, Body: []byte("zombie")}})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the dead execution's completion: %v, want idem.ErrLeaseLost", err)
	}
	if replay := proc.order(ctx, "acme", "dead-1", "tea"); !bytes.Equal(replay.body, a.body) {
		t.Fatalf("replay %v, want the takeover's %q", replay, a.body)
	}
	if o := db.ordersOf(t, "acme", "dead-1"); len(o) != 1 {
		t.Fatalf("%d orders, want 1", len(o))
	}
}

// fingerprintOf learns the fingerprint the middleware computes for an
// order request, by sending it once under a throwaway key and reading the
// record back, so that a test claiming directly claims the same request.
func fingerprintOf(t *testing.T, s *stack, tenant, key, item string) []byte {
	t.Helper()
	probe := key + "-probe"
	if a := s.order(context.Background(), tenant, probe, item); a.status != http.StatusCreated {
		t.Fatalf("probe: %v", a)
	}
	rec, err := s.conn.store.Get(context.Background(), tenant, probe)
	if err != nil {
		t.Fatal(err)
	}
	return rec.Fingerprint
}

// wantNoneInFlight fails t if a record is still in flight.
func wantNoneInFlight(t *testing.T, db *database) {
	t.Helper()
	for _, r := range db.records(t) {
		if r.state != string(idem.StateInFlight) {
			continue
		}
		t.Errorf("record (%s, %s) left in flight", r.tenant, r.key)
	}
}
