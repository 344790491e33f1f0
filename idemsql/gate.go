package idemsql

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
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
//
// The gate also knows which leases are held by the transaction holding
// the lock (owners): an extension of one of them is skipped and recorded
// as owed (see Store.Extend), even one already waiting when its unit of
// work took the lock; a step saved for one of them fails at once with
// ErrStepAfterStatement instead of waiting for the lock its own
// transaction holds (see Store.SaveStep).
type gate struct {
	mu     sync.Mutex
	held   bool
	urgent []*gateWaiter
	normal []*gateWaiter
	// moved is closed, and replaced, whenever the gate passes to another
	// writer: waiters measure their limit from the last move.
	moved  chan struct{}
	owners map[lease]*owner
}

// owner is a unit of work whose transaction holds the write lock, seen
// from the gate.
type owner struct {
	owed *idem.ExtendParams // the last extension skipped for its lease
}

type gateWaiter struct {
	ready   chan struct{} // closed when the gate passes to this waiter, or excuses it
	granted bool          // set under gate.mu when it passes
	// An extension: the lease it extends, and whether the transaction of
	// that lease took the lock meanwhile (excused: nothing to write).
	extend  *idem.ExtendParams
	excused bool
	// A step: the lease it is saved for; refused when the transaction of
	// that lease took the lock meanwhile (excused).
	step *lease
}

func newGate() *gate {
	return &gate{moved: make(chan struct{}), owners: map[lease]*owner{}}
}

// errGateTimeout is wrapped by the error of a writer that waited longer
// than the database's busy timeout while the lock did not change hands.
var errGateTimeout = errors.New("database is locked")

// acquire waits for the gate, until ctx ends or limit (when positive) has
// passed without the gate changing hands.
func (g *gate) acquire(ctx context.Context, limit time.Duration) error {
	_, err := g.wait(ctx, limit, &gateWaiter{})
	return err
}

// acquireExtend waits for the gate for the extension p, before every
// other writer, and reports skipped when p's own unit of work holds the
// write lock: then it has recorded p as owed, and the caller does not hold
// the gate.
func (g *gate) acquireExtend(ctx context.Context, limit time.Duration, p idem.ExtendParams) (skipped bool, err error) {
	return g.wait(ctx, limit, &gateWaiter{extend: &p})
}

// acquireStep waits for the gate for a step of the execution l, among the
// other writers, and returns ErrStepAfterStatement, without the gate, when
// l's own unit of work holds the write lock (now, or from some moment
// while it waited): the step's record would wait for that transaction,
// which waits for the handler, which waits for the step.
func (g *gate) acquireStep(ctx context.Context, limit time.Duration, l lease) error {
	excused, err := g.wait(ctx, limit, &gateWaiter{step: &l})
	if err == nil && excused {
		err = ErrStepAfterStatement
	}
	return err
}

// wait queues w, a writer: an extension (w.extend), a step (w.step), or
// any other, and reports whether it was excused (see acquireExtend and
// acquireStep) rather than given the gate.
func (g *gate) wait(ctx context.Context, limit time.Duration, w *gateWaiter) (excused bool, err error) {
	g.mu.Lock()
	if w.extend != nil {
		if o := g.owners[leaseOf(*w.extend)]; o != nil {
			o.owed = w.extend
			g.mu.Unlock()
			return true, nil
		}
	}
	if w.step != nil && g.owners[*w.step] != nil {
		g.mu.Unlock()
		return true, nil
	}
	if !g.held {
		g.held = true
		g.mu.Unlock()
		return false, nil
	}
	w.ready = make(chan struct{})
	if w.extend != nil {
		g.urgent = append(g.urgent, w)
	} else {
		g.normal = append(g.normal, w)
	}
	moved := g.moved
	g.mu.Unlock()

	var timer *time.Timer
	var timeout <-chan time.Time
	if limit > 0 {
		timer = time.NewTimer(limit)
		defer timer.Stop()
		timeout = timer.C
	}
	for {
		select {
		case <-w.ready:
			return w.excused, nil
		case <-moved:
			// The queue moves: the holder that was keeping the lock is
			// gone, so the wait starts afresh.
			g.mu.Lock()
			moved = g.moved
			g.mu.Unlock()
			if timer != nil {
				timer.Reset(limit)
			}
			continue
		case <-ctx.Done():
			err = ctx.Err()
		case <-timeout:
			err = fmt.Errorf("%w: waited %v (the busy timeout) for the write lock, held meanwhile by one execution of this process", errGateTimeout, limit)
		}
		break
	}
	g.mu.Lock()
	switch {
	case w.excused:
		g.mu.Unlock()
		return true, nil
	case w.granted:
		// Passed to us as we gave up: pass it on.
		g.mu.Unlock()
		g.release()
		return false, err
	}
	g.urgent = remove(g.urgent, w)
	g.normal = remove(g.normal, w)
	g.mu.Unlock()
	return false, err
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
	close(g.moved)
	g.moved = make(chan struct{})
}

// own records that the holder of the gate, a unit of work running under
// l, now holds the write lock in its transaction, and excuses the
// extensions and the steps of l already waiting.
func (g *gate) own(l lease) {
	g.mu.Lock()
	defer g.mu.Unlock()
	o := &owner{}
	g.owners[l] = o
	kept := g.urgent[:0]
	for _, w := range g.urgent {
		if leaseOf(*w.extend) == l {
			o.owed = w.extend
			w.excused = true
			close(w.ready)
			continue
		}
		kept = append(kept, w)
	}
	g.urgent = kept
	kept = g.normal[:0]
	for _, w := range g.normal {
		if w.step != nil && *w.step == l {
			w.excused = true
			close(w.ready)
			continue
		}
		kept = append(kept, w)
	}
	g.normal = kept
}

// disown ends what own began, before the transaction gives up the lock:
// from then on an extension or a step of l waits for the gate. It returns
// the extension owed, if any.
func (g *gate) disown(l lease) (owed *idem.ExtendParams) {
	g.mu.Lock()
	defer g.mu.Unlock()
	o := g.owners[l]
	delete(g.owners, l)
	if o == nil {
		return nil
	}
	return o.owed
}

func leaseOf(p idem.ExtendParams) lease { return lease{p.Tenant, p.Key, p.Token} }

func remove(ws []*gateWaiter, w *gateWaiter) []*gateWaiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}

// lockWrites waits for this Store's turn to write, on SQLite; elsewhere
// it does nothing.
func (s *Store) lockWrites(ctx context.Context) error {
	if s.writes == nil {
		return nil
	}
	return s.writes.acquire(ctx, s.writeLimit(ctx))
}

// unlockWrites ends the turn lockWrites gave.
func (s *Store) unlockWrites() {
	if s.writes != nil {
		s.writes.release()
	}
}

// defaultBusyLimit bounds a writer's wait for the write lock when the
// database's busy timeout cannot be read.
const defaultBusyLimit = 10 * time.Second

// writeLimit is how long a writer waits for its turn while the lock does
// not change hands: as long as SQLite would let it wait for the lock
// itself (the connections' busy timeout). A queue that moves is waited
// out, as database/sql's pool queue would be; a writer that can never get
// the lock (a handler that claims another key of the same Store inside
// its own transaction) fails as it would without the queue, rather than
// waiting for ever.
func (s *Store) writeLimit(ctx context.Context) time.Duration {
	if ms := s.busyLimit.Load(); ms != 0 {
		return time.Duration(ms) * time.Millisecond
	}
	var ms int64
	if err := s.db.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&ms); err != nil {
		return defaultBusyLimit
	}
	if ms <= 0 {
		// No busy timeout: SQLite fails at once on a held lock; the
		// queue still waits, for the default.
		ms = defaultBusyLimit.Milliseconds()
	}
	s.busyLimit.Store(ms)
	return time.Duration(ms) * time.Millisecond
}
