package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idemclient"
)

// kill is what a kill caught, key by key.
type kill struct {
	seq int // the network's events before the kill
	// inCall: keys whose card call had reached the network and not been
	// answered; answered: keys whose card call had been answered but not
	// recorded; charged: those of both whose card had been charged;
	// recorded: keys whose charge was recorded (idem.Step) and whose
	// answer was not complete.
	inCall, charged, answered, recorded []string
	complete, notStarted                int
}

// TestKillDuringCardCall kills the payments server (SIGKILL) while
// payments are being charged, restarts it on the same address, and lets
// the clients retry with the same keys until they get answers. It sends
// 20 payments at once and makes both windows happen before it kills, by
// holding them open rather than hoping to hit them: the card network
// holds the first charge it receives (its card call is in flight), and a
// lock on the payments table holds every other payment after its charge
// is recorded (idem.Step) and before its row is written (recorded, not
// complete). It kills once both are there. The retry of the first must
// charge under the same downstream key (the network answers with the
// first charge); the others must reuse their recorded charges and not
// call the network at all. Every payment must then have moved money
// exactly once.
func TestKillDuringCardCall(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts and kills server processes (-short)")
	}
	db := database(t)
	held := make(chan struct{})   // closed when the held charge arrives
	unhold := make(chan struct{}) // closed to let it go on
	var holding atomic.Bool
	obs := &observer{}
	network, cardURL := startNetwork(t, &cardnet.Config{ObserveFunc: func(e cardnet.Event) {
		obs.observe(e)
		// The first charge only (not a sync.Once, whose Do would hold
		// every other call too).
		if e.Kind == cardnet.Received && holding.CompareAndSwap(false, true) {
			close(held)
			<-unhold
		}
	}})
	addr := freeAddr(t)
	// A short lease, so that a retry takes over a killed server's payment
	// 2s after its last heartbeat rather than 90s.
	srv := startChild(t, addr, "-db", db.url, "-card-url", cardURL, "-lease", "2s")
	base := "http://" + addr
	merchant := "m_" + randomHex(4)
	// The reviewer's client: 100ms per attempt. It retries refused
	// connections while the server is down, and 409s until the lease of
	// a killed execution ends.
	client := idemclient.NewClient(&idemclient.Transport{
		AttemptTimeout: 100 * time.Millisecond, MaxAttempts: 1000,
		BaseDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The server made the payments table: lock it against inserts.
	lock, err := db.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback(context.Background()) //nolint:errcheck // rolled back below
	if _, err := lock.Exec(ctx, `LOCK TABLE payments IN SHARE MODE`); err != nil {
		t.Fatal(err)
	}

	const perRound = 20
	calls := paymentCalls(merchant, "r0", perRound)
	done := make(chan []callResult, 1)
	go func() { done <- sendAll(ctx, client, base, calls) }()
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("no charge reached the card network")
	}
	// Wait for a charge recorded behind the lock (a condition, polled).
	for !anyRecorded(t, db, merchant) {
		select {
		case <-ctx.Done():
			t.Fatal("no charge was recorded while the payments table was locked")
		case <-time.After(10 * time.Millisecond):
		}
	}
	seq := obs.len()
	srv.kill()
	k := classify(t, db, seq, calls, obs)
	t.Logf("killed: %d in the card call, %d answered by the network but not recorded (%d of these charged), %d recorded but not complete, %d complete, %d not at the network yet",
		len(k.inCall), len(k.answered), len(k.charged), len(k.recorded), k.complete, k.notStarted)
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	close(unhold)
	srv.start()
	results := <-done

	checkExactlyOnce(t, db, network, merchant, paymentsKind, calls, results)

	// A charge recorded before the kill is reused by the execution that
	// takes the payment over: the network hears of it no more.
	for _, c := range calls {
		if !slices.Contains(k.recorded, c.key) {
			continue
		}
		dk := downstreamKey(t, c, "charge")
		if n := obs.receivedAfter(dk, k.seq); n > 0 {
			t.Errorf("%s: its charge was recorded before the kill, yet the card network was called %d more times", c.key, n)
		}
	}
	if !covered([]kill{k}) {
		t.Errorf("the kill caught %d card calls in flight and %d recorded charges not completed; both windows were held open, so both must be there", len(k.inCall)+len(k.answered), len(k.recorded))
	}
}

// anyRecorded reports whether a payment of merchant has its charge
// recorded and is not complete.
func anyRecorded(t *testing.T, db testDB, merchant string) bool {
	for _, rec := range records(t, db.pool, merchant) {
		if rec.state != "complete" && rec.hasSteps {
			return true
		}
	}
	return false
}

// covered reports whether the kills caught both windows.
func covered(kills []kill) bool {
	var inCall, recorded bool
	for _, k := range kills {
		inCall = inCall || len(k.inCall)+len(k.answered) > 0
		recorded = recorded || len(k.recorded) > 0
	}
	return inCall && recorded
}

// classify says where each payment of batch stood when the server was
// killed, from the network's first seq events and idem's records (which
// no one changes while the server is down).
func classify(t *testing.T, db testDB, seq int, batch []apiCall, obs *observer) kill {
	t.Helper()
	k := kill{seq: seq}
	recs := records(t, db.pool, batch[0].merchant)
	before := obs.before(seq)
	for _, c := range batch {
		dk := downstreamKey(t, c, "charge")
		ev := before[dk]
		rec, claimed := recs[c.key]
		switch {
		case claimed && rec.state == "complete":
			k.complete++
		case claimed && rec.hasSteps:
			k.recorded = append(k.recorded, c.key)
		case ev[cardnet.Answered]:
			k.answered = append(k.answered, c.key)
		case ev[cardnet.Received]:
			k.inCall = append(k.inCall, c.key)
		default:
			k.notStarted++
			continue
		}
		if ev[cardnet.Moved] && (!claimed || rec.state != "complete" && !rec.hasSteps) {
			k.charged = append(k.charged, c.key)
		}
	}
	return k
}

// observer keeps the card network's events.
type observer struct {
	mu     sync.Mutex
	events []cardnet.Event
}

func (o *observer) observe(e cardnet.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
}

func (o *observer) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.events)
}

// before returns, by downstream key, the kinds of the first seq events.
func (o *observer) before(seq int) map[string]map[cardnet.EventKind]bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string]map[cardnet.EventKind]bool{}
	for _, e := range o.events[:seq] {
		if out[e.Key] == nil {
			out[e.Key] = map[cardnet.EventKind]bool{}
		}
		out[e.Key][e.Kind] = true
	}
	return out
}

// receivedAfter counts the calls under key that arrived after the first
// seq events.
func (o *observer) receivedAfter(key string, seq int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, e := range o.events[seq:] {
		if e.Key == key && e.Kind == cardnet.Received {
			n++
		}
	}
	return n
}
