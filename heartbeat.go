package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// keeper extends the leases of the running handlers of one engine: a map
// of them under a mutex, and one goroutine that looks for the leases due
// every quarter of the interval while there are any. A request costs a
// map insert and a delete; a timer of its own (time.AfterFunc, then
// Stop) measured about four times that, and two allocations, for
// handlers that almost all finish long before their first beat is due.
//
// When the store says a lease is lost, the keeper cancels that handler's
// context: its completion would be refused anyway, so it may as well stop.
type keeper struct {
	store    Store
	interval time.Duration
	logger   *slog.Logger

	// Observation, set by the engine: the store's name and the tracer's
	// optional parts (nil when not wanted).
	storeName   string
	storeTracer StoreTracer
	leaseTracer LeaseTracer

	mu      sync.Mutex
	leases  map[*execution]struct{}
	running bool           // the loop runs
	closed  bool           // Engine.Close stopped the keeper
	stop    chan struct{}  // closed by Engine.Close
	wg      sync.WaitGroup // the loop and the extensions under way
}

func newKeeper(store Store, interval time.Duration, logger *slog.Logger) *keeper {
	return &keeper{store: store, interval: interval, logger: logger, leases: make(map[*execution]struct{}), stop: make(chan struct{})}
}

// lease is what the keeper keeps of a running execution, guarded by
// keeper.mu.
type lease struct {
	due       time.Time // when the next extension is due; zero until the loop first sees it
	extending bool      // an Extend call is under way
	lost      bool      // the store refused an extension
}

// tick is how often the loop looks for due leases: a quarter of the
// interval, so an extension is at most that late (the lease itself lasts
// three intervals by default).
func (k *keeper) tick() time.Duration {
	return max(k.interval/4, time.Millisecond)
}

// add starts keeping x's lease alive.
func (k *keeper) add(x *execution) {
	k.mu.Lock()
	k.leases[x] = struct{}{}
	if !k.running && !k.closed {
		k.running = true
		k.wg.Add(1)
		go k.loop()
	}
	k.mu.Unlock()
}

// remove stops keeping x's lease and reports whether it was found lost.
// An extension under way finishes unheeded.
func (k *keeper) remove(x *execution) (lost bool) {
	k.mu.Lock()
	delete(k.leases, x)
	lost = x.lease.lost
	k.mu.Unlock()
	return lost
}

// loop runs while there are leases to keep, and ends at once when the
// engine is closed.
func (k *keeper) loop() {
	defer k.wg.Done()
	ticker := time.NewTicker(k.tick())
	defer ticker.Stop()
	for {
		select {
		case <-k.stop:
			return
		case now := <-ticker.C:
			if !k.beat(now) {
				return
			}
		}
	}
}

// beat starts the extensions due at now, and reports whether the loop
// should go on.
func (k *keeper) beat(now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed || len(k.leases) == 0 {
		k.running = false
		return false
	}
	for x := range k.leases {
		l := &x.lease
		if l.due.IsZero() {
			// Added since the last tick: due a whole interval from this
			// one, so at most a tick late, never early (and no clock
			// read for the many leases that end before their first
			// tick).
			l.due = now.Add(k.interval)
			continue
		}
		if l.extending || l.lost || now.Before(l.due) {
			continue
		}
		l.extending = true
		k.wg.Add(1)
		go k.extend(x)
	}
	return true
}

// close stops the loop and waits for it and the extensions under way.
// Leases still held are no longer extended: Engine.Close documents that
// it is called once no execution runs.
func (k *keeper) close() {
	k.mu.Lock()
	if !k.closed {
		k.closed = true
		close(k.stop)
	}
	k.mu.Unlock()
	k.wg.Wait()
}

// extend runs one Extend call for x, outside the keeper's lock so that a
// slow store delays no other lease.
func (k *keeper) extend(x *execution) {
	defer k.wg.Done()
	p := ExtendParams{Tenant: x.op.Tenant, Key: x.op.Key, Token: x.token, Lease: x.e.config.Lease}
	var err error
	if k.storeTracer == nil {
		ctx, cancel := context.WithTimeout(context.Background(), k.interval)
		err = k.store.Extend(ctx, p)
		cancel()
	} else {
		// The handler's context carries the operation's values (its
		// span), without its end: the extension is the keeper's.
		ctx, s := startStore(context.WithoutCancel(x.hctx), k.storeTracer, StoreExtend, k.storeName)
		ctx, cancel := context.WithTimeout(ctx, k.interval)
		err = k.store.Extend(ctx, p)
		cancel()
		s.end(ctx, err)
	}

	k.mu.Lock()
	l := &x.lease
	l.extending = false
	if _, kept := k.leases[x]; !kept {
		k.mu.Unlock()
		return // the handler finished meanwhile
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		l.lost = true
		// Before the cancellation: a step that sees the context
		// cancelled must find the lease known lost (Step).
		x.st.lost.Store(true)
		x.cancel(ErrLeaseLost)
	case err != nil:
		// A store hiccup: the lease still runs for a while; try again at
		// the next tick rather than waiting a whole interval.
		l.due = time.Now()
	default:
		l.due = time.Now().Add(k.interval)
	}
	k.mu.Unlock()
	if err != nil && !errors.Is(err, ErrLeaseLost) {
		k.logger.Warn("idem: lease heartbeat failed; retrying at the next tick", slog.String("store", k.storeName),
			slog.String("key", p.Key), errorAttr(err))
		if k.leaseTracer != nil {
			k.leaseTracer.TraceLease(context.WithoutCancel(x.hctx), TraceLeaseData{Event: LeaseHeartbeatFailed, Store: k.storeName, Err: err})
		}
	}
}
