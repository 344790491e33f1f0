package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idemclient"
)

// killPoint says when a round kills the server: after the n-th call of
// the round of the given kind, and a random pause under maxDelay.
type killPoint struct {
	name     string
	kind     cardnet.EventKind
	maxDelay time.Duration
}

var killPoints = []killPoint{
	// Charges in flight: their cards are being charged, some already
	// are, none is recorded.
	{"during the card calls", cardnet.Received, 40 * time.Millisecond},
	// Just after a card network's answer: its charge is being recorded
	// (idem.Step), or its row written, or its answer completed.
	{"after a card call", cardnet.Answered, 5 * time.Millisecond},
}

// kill is what a kill caught, key by key.
type kill struct {
	point string
	seq   int // the network's events before the kill
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
// the clients retry with the same keys until they get answers. Each round
// sends 20 payments at once and kills the server once, at a random point:
// during the card calls, or just after one. The rounds go on until the
// kills have caught both a payment whose card call was in flight (the
// retry must charge it under the same downstream key: the network answers
// with the first charge) and one whose charge was recorded but not
// completed (the retry must reuse the recorded charge and not call the
// network at all). Every payment must then have moved money exactly once.
func TestKillDuringCardCall(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts and kills server processes (-short)")
	}
	db := database(t)
	obs := &observer{}
	network, cardURL := startNetwork(t, &cardnet.Config{ObserveFunc: obs.observe})
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

	const minRounds, maxRounds, perRound = 2, 10, 20
	var calls []apiCall
	var results []callResult
	var kills []kill
	for round := 0; round < maxRounds; round++ {
		if round >= minRounds && covered(kills) {
			break
		}
		batch := paymentCalls(merchant, fmt.Sprintf("r%d", round), perRound)
		point := killPoints[round%len(killPoints)]
		trigger := obs.arm(point.kind, 1+rand.IntN(perRound/2))
		done := make(chan []callResult, 1)
		go func() { done <- sendAll(ctx, client, base, batch) }()

		var got []callResult
		select {
		case <-trigger:
			time.Sleep(rand.N(point.maxDelay + 1))
			seq := obs.len()
			srv.kill()
			k := classify(t, db, merchant, point.name, seq, batch, obs)
			kills = append(kills, k)
			t.Logf("round %d, killed %s: %d in the card call, %d answered by the network but not recorded (%d of these charged), %d recorded but not complete, %d complete, %d not at the network yet",
				round, point.name, len(k.inCall), len(k.answered), len(k.charged), len(k.recorded), k.complete, k.notStarted)
			srv.start()
			got = <-done
		case got = <-done:
			t.Logf("round %d: every payment was answered before the kill point", round)
		}
		obs.disarm()
		calls = append(calls, batch...)
		results = append(results, got...)
	}

	checkExactlyOnce(t, db, network, merchant, paymentsKind, calls, results)

	var inCall, charged, recorded int
	for _, k := range kills {
		inCall += len(k.inCall) + len(k.answered)
		charged += len(k.charged)
		recorded += len(k.recorded)
		// A charge recorded before the kill is reused by the execution
		// that takes the payment over: the network hears of it no more.
		for _, key := range k.recorded {
			dk := downstreamKey(t, merchant, key, "charge")
			if n := obs.receivedAfter(dk, k.seq); n > 0 {
				t.Errorf("%s: its charge was recorded before the kill, yet the card network was called %d more times", key, n)
			}
		}
	}
	t.Logf("%d kills; they caught %d payments whose card call was under way or answered but not recorded (%d charged), %d whose charge was recorded and answer not complete",
		len(kills), inCall, charged, recorded)
	if !covered(kills) {
		t.Errorf("in %d rounds the kills never caught both a card call in flight and a recorded charge not completed: the test proved less than it says", maxRounds)
	}
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
func classify(t *testing.T, db testDB, merchant, point string, seq int, batch []apiCall, obs *observer) kill {
	t.Helper()
	k := kill{point: point, seq: seq}
	recs := records(t, db.pool, merchant)
	before := obs.before(seq)
	for _, c := range batch {
		dk := downstreamKey(t, merchant, c.key, "charge")
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

// observer keeps the card network's events, and fires a trigger on the
// n-th event of a kind.
type observer struct {
	mu      sync.Mutex
	events  []cardnet.Event
	kind    cardnet.EventKind
	left    int
	trigger chan struct{}
}

func (o *observer) observe(e cardnet.Event) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, e)
	if o.trigger != nil && e.Kind == o.kind {
		if o.left--; o.left == 0 {
			close(o.trigger)
			o.trigger = nil
		}
	}
}

// arm returns a channel closed at the n-th event of kind from now on.
func (o *observer) arm(kind cardnet.EventKind, n int) <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kind, o.left, o.trigger = kind, n, make(chan struct{})
	return o.trigger
}

func (o *observer) disarm() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.trigger = nil
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
