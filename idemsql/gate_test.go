package idemsql

import (
	"context"
	"errors"
	"testing"
	"time"
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

// TestGateOrder: the gate passes in arrival order, extensions (urgent)
// before everything else.
func TestGateOrder(t *testing.T) {
	g := &gate{}
	ctx := context.Background()
	if err := g.acquire(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 3)
	wait := func(name string, urgent bool) {
		if err := g.acquire(ctx, urgent, 0); err != nil {
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
	if err := g.acquire(ctx, false, 0); err != nil {
		t.Fatalf("the gate stayed held: %v", err)
	}
}

// TestGateGiveUp: a waiter whose context ends, or whose limit passes,
// leaves the queue, and the gate passes to the next one.
func TestGateGiveUp(t *testing.T) {
	g := &gate{}
	ctx := context.Background()
	if err := g.acquire(ctx, false, 0); err != nil {
		t.Fatal(err)
	}
	if err := g.acquire(ctx, false, time.Millisecond); !errors.Is(err, errGateTimeout) {
		t.Fatalf("past its limit: %v, want errGateTimeout", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	gaveUp := make(chan error)
	go func() { gaveUp <- g.acquire(cancelled, true, 0) }()
	g.queued(1, 0)
	next := make(chan error)
	go func() { next <- g.acquire(ctx, false, 0) }()
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
	g.mu.Lock()
	held := g.held
	g.mu.Unlock()
	if held {
		t.Fatal("the gate is still held")
	}
}
