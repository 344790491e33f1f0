package idemsql

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// queued waits until the gate holds urgent and normal waiters.
func (g *gate) queued(urgent, normal int) {
	for {
		g.mu.Lock()
		u, n := len(g.urgent), len(g.normal)
		g.mu.Unlock()
		if u == urgent && n == normal {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *gate) isHeld() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.held
}

// TestGateOrder: the gate passes in arrival order, extensions before
// everything else.
func TestGateOrder(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	if err := g.acquire(ctx, 0); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 3)
	wait := func(name string, extend bool) {
		var err error
		if extend {
			_, err = g.acquireExtend(ctx, 0, idem.ExtendParams{Key: name})
		} else {
			err = g.acquire(ctx, 0)
		}
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
		order <- name
		g.release()
	}
	go wait("claim 1", false)
	g.queued(0, 1)
	go wait("claim 2", false)
	g.queued(0, 2)
	go wait("extend", true)
	g.queued(1, 2)
	g.release()
	for _, want := range []string{"extend", "claim 1", "claim 2"} {
		if got := <-order; got != want {
			t.Fatalf("passed to %q, want %q", got, want)
		}
	}
	g.queued(0, 0)
	if err := g.acquire(ctx, 0); err != nil {
		t.Fatalf("the gate stayed held: %v", err)
	}
}

// TestGateGiveUp: a waiter whose context ends, or that waited its limit
// while the gate did not move, leaves the queue, and the gate passes to
// the next one.
func TestGateGiveUp(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	if err := g.acquire(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.acquire(ctx, time.Millisecond); !errors.Is(err, errGateTimeout) {
		t.Fatalf("past its limit: %v, want errGateTimeout", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error)
	go func() { _, err := g.acquireExtend(cancelled, 0, idem.ExtendParams{Key: "k"}); gaveUp <- err }()
	g.queued(1, 0)
	next := make(chan error)
	go func() { next <- g.acquire(ctx, 0) }()
	g.queued(1, 1)
	cancel()
	if err := <-gaveUp; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	g.release()
	if err := <-next; err != nil {
		t.Fatalf("next waiter: %v", err)
	}
	g.release()
	if g.isHeld() {
		t.Fatal("the gate is still held")
	}
}

// TestGateLimitCountsFromTheLastMove: a writer waits out a queue that
// moves, however long; the limit counts only the time the gate stays with
// one holder.
func TestGateLimitCountsFromTheLastMove(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	const limit = time.Second
	if err := g.acquire(ctx, 0); err != nil {
		t.Fatal(err)
	}
	last := make(chan error)
	go func() { last <- g.acquire(ctx, limit) }()
	g.queued(0, 1)
	// Writers ahead of it, each holding the gate for less than the limit,
	// together for several times the limit.
	start := time.Now()
	for range 15 {
		ahead := make(chan error)
		g.mu.Lock()
		w := &gateWaiter{ready: make(chan struct{})}
		g.normal = append([]*gateWaiter{w}, g.normal...) // cuts in, for the test
		g.mu.Unlock()
		go func() { <-w.ready; ahead <- nil }()
		g.release()
		<-ahead
		time.Sleep(limit / 10) // 1.5 limits in all
	}
	g.release()
	if err := <-last; err != nil {
		t.Fatalf("after %v in a moving queue: %v, want the gate", time.Since(start), err)
	}
	g.release()
}

// TestGateOwners: an extension of a lease whose transaction holds the
// lock is skipped and recorded as owed, whether it comes after the unit
// took the lock or was already waiting; once disowned, extensions wait
// again.
func TestGateOwners(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	l := lease{"t", "k", 7}
	p := idem.ExtendParams{Tenant: "t", Key: "k", Token: 7, Lease: time.Second}
	if err := g.acquire(ctx, 0); err != nil { // the unit takes the gate...
		t.Fatal(err)
	}
	waiting := make(chan bool)
	go func() {
		skipped, err := g.acquireExtend(ctx, 0, p)
		if err != nil {
			t.Error(err)
		}
		waiting <- skipped
	}()
	g.queued(1, 0)
	g.own(l) // ...and then its transaction the lock
	if !<-waiting {
		t.Fatal("the extension waiting when its unit took the lock was not skipped")
	}
	other := idem.ExtendParams{Tenant: "t", Key: "other", Token: 8}
	go func() { skipped, _ := g.acquireExtend(ctx, 0, other); waiting <- skipped }()
	g.queued(1, 0)
	later := p
	later.Lease = 2 * time.Second
	// A failure deadline: a gate that made the extension wait would hold
	// it for ever.
	bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if skipped, err := g.acquireExtend(bounded, 0, later); !skipped || err != nil {
		t.Fatalf("an extension while its unit holds the lock: skipped %v, %v", skipped, err)
	}
	if owed := g.disown(l); owed == nil || owed.Lease != later.Lease {
		t.Fatalf("owed %+v, want the last skipped extension", owed)
	}
	g.release()
	if <-waiting {
		t.Fatal("another lease's extension was skipped")
	}
	g.release()
	if skipped, err := g.acquireExtend(ctx, 0, p); skipped || err != nil {
		t.Fatalf("after disown: skipped %v, %v; want the gate", skipped, err)
	}
	g.release()
}

// TestGateStepOfOwner: a step of a lease whose unit of work takes the lock
// while the step waits is refused with ErrStepAfterStatement, at once,
// rather than left waiting for the lock its own transaction holds; so is
// one that comes while the unit holds it; once disowned, a step waits for
// the gate again.
func TestGateStepOfOwner(t *testing.T) {
	g := newGate()
	ctx := context.Background()
	if err := g.acquire(ctx, 0); err != nil { // another writer
		t.Fatal(err)
	}
	l := lease{"t", "k", 1}
	unitHolds := make(chan struct{})
	go func() {
		if err := g.acquire(ctx, 0); err != nil { // the unit of l
			t.Error(err)
		}
		g.own(l)
		close(unitHolds)
	}()
	g.queued(0, 1)
	stepErr := make(chan error, 1)
	go func() {
		// Bounded: a step left waiting behind its own unit would wait for
		// ever.
		bounded, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		stepErr <- g.acquireStep(bounded, 0, l)
	}()
	g.queued(0, 2)
	g.release() // to the unit, which owns l and excuses the step
	<-unitHolds
	if err := <-stepErr; !errors.Is(err, ErrStepAfterStatement) {
		t.Fatalf("the step waiting when its unit took the lock: %v, want ErrStepAfterStatement", err)
	}
	if err := g.acquireStep(ctx, 0, l); !errors.Is(err, ErrStepAfterStatement) {
		t.Fatalf("a step while the unit holds the lock: %v, want ErrStepAfterStatement", err)
	}
	g.disown(l)
	g.release()
	if err := g.acquireStep(ctx, 0, l); err != nil {
		t.Fatalf("a step after disown: %v, want the gate", err)
	}
	g.release()
}
