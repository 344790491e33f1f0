package idemsql

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// gate lets one writer of this Store at a time at a SQLite database,
// which has a single write lock. Writers queue here, in order, instead of
// in SQLite's busy handler, which polls with sleeps of up to 100 ms and
// serves whoever polls first: under a burst, a writer could lose every
// round until its busy timeout ran out, while the lock was free most of
// the time. Here the lock passes at once, in arrival order, except that
// lease extensions go first: an extension is one short UPDATE, and
// letting it wait behind claims could let one of them take over the key
// of a handler that is still running. Writers of other processes still
// meet at SQLite's lock, through the busy timeout.
type gate struct {
	mu     sync.Mutex
	held   bool
	urgent []*gateWaiter
	normal []*gateWaiter
}

type gateWaiter struct {
	ready   chan struct{} // closed when the gate passes to this waiter
	granted bool          // set under gate.mu when it does
}

// errGateTimeout is wrapped by the error of a writer that waited for the
// write lock longer than the database's busy timeout.
var errGateTimeout = errors.New("database is locked")

// acquire waits for the gate, until ctx ends or limit (when positive) has
// passed. An urgent waiter goes before every normal one.
func (g *gate) acquire(ctx context.Context, urgent bool, limit time.Duration) error {
	g.mu.Lock()
	if !g.held {
		g.held = true
		g.mu.Unlock()
		return nil
	}
	w := &gateWaiter{ready: make(chan struct{})}
	if urgent {
		g.urgent = append(g.urgent, w)
	} else {
		g.normal = append(g.normal, w)
	}
	g.mu.Unlock()

	var timeout <-chan time.Time
	if limit > 0 {
		t := time.NewTimer(limit)
		defer t.Stop()
		timeout = t.C
	}
	var err error
	select {
	case <-w.ready:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timeout:
		err = fmt.Errorf("%w: waited %v (the busy timeout) for the write lock, held by another execution of this process", errGateTimeout, limit)
	}
	g.mu.Lock()
	if w.granted {
		// Passed to us as we gave up: pass it on.
		g.mu.Unlock()
		g.release()
		return err
	}
	g.urgent = remove(g.urgent, w)
	g.normal = remove(g.normal, w)
	g.mu.Unlock()
	return err
}

// release passes the gate to the next waiter, or opens it.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	var next *gateWaiter
	switch {
	case len(g.urgent) > 0:
		next, g.urgent = g.urgent[0], g.urgent[1:]
	case len(g.normal) > 0:
		next, g.normal = g.normal[0], g.normal[1:]
	default:
		g.held = false
		return
	}
	next.granted = true
	close(next.ready)
}

func remove(ws []*gateWaiter, w *gateWaiter) []*gateWaiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}
