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
	leases  map[*lease]struct{}
	running bool           // the loop runs
	closed  bool           // Engine.Close stopped the keeper
	stop    chan struct{}  // closed by Engine.Close
	wg      sync.WaitGroup // the loop and the extensions under way
}

func newKeeper(store Store, interval time.Duration, logger *slog.Logger) *keeper {
	return &keeper{store: store, interval: interval, logger: logger, leases: make(map[*lease]struct{}), stop: make(chan struct{})}
}

// lease is one running handler's claim as the keeper sees it.
type lease struct {
	params ExtendParams
	// ctx is the handler's: its values (a span) go with the extensions.
	ctx    context.Context
	st     *execState
	cancel context.CancelCauseFunc // ends ctx

	// Guarded by keeper.mu.
	due       time.Time // when the next extension is due
	extending bool      // an Extend call is under way
	lost      bool      // the store refused an extension
}

// tick is how often the loop looks for due leases: a quarter of the
// interval, so an extension is at most that late (the lease itself lasts
// three intervals by default).
func (k *keeper) tick() time.Duration {
	return max(k.interval/4, time.Millisecond)
}

// add starts keeping l, the lease p of the handler running under ctx,
// alive; cancel ends ctx when the lease is lost.
func (k *keeper) add(l *lease, p ExtendParams, ctx context.Context, st *execState, cancel context.CancelCauseFunc) {
	*l = lease{params: p, ctx: ctx, st: st, cancel: cancel, due: time.Now().Add(k.interval)}
	k.mu.Lock()
	k.leases[l] = struct{}{}
	if !k.running && !k.closed {
		k.running = true
		k.wg.Add(1)
		go k.loop()
	}
	k.mu.Unlock()
}

// remove stops keeping l and reports whether its lease was found lost. An
// extension under way finishes unheeded.
func (k *keeper) remove(l *lease) (lost bool) {
	k.mu.Lock()
	delete(k.leases, l)
	lost = l.lost
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
	for l := range k.leases {
		if l.extending || l.lost || now.Before(l.due) {
			continue
		}
		l.extending = true
		k.wg.Add(1)
		go k.extend(l)
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

// extend runs one Extend call for l, outside the keeper's lock so that a
// slow store delays no other lease.
func (k *keeper) extend(l *lease) {
	defer k.wg.Done()
	var err error
	if k.storeTracer == nil {
		ctx, cancel := context.WithTimeout(context.Background(), k.interval)
		err = k.store.Extend(ctx, l.params)
		cancel()
	} else {
		// The handler's context carries the operation's values (its
		// span), without its end: the extension is the keeper's.
		ctx, s := startStore(context.WithoutCancel(l.ctx), k.storeTracer, StoreExtend, k.storeName)
		ctx, cancel := context.WithTimeout(ctx, k.interval)
		err = k.store.Extend(ctx, l.params)
		cancel()
		s.end(ctx, err)
	}

	k.mu.Lock()
	l.extending = false
	if _, kept := k.leases[l]; !kept {
		k.mu.Unlock()
		return // the handler finished meanwhile
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		l.lost = true
		// Before the cancellation: a step that sees the context
		// cancelled must find the lease known lost (Step).
		l.st.lost.Store(true)
		l.cancel(ErrLeaseLost)
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
			slog.String("key", l.params.Key), errorAttr(err))
		if k.leaseTracer != nil {
			k.leaseTracer.TraceLease(context.WithoutCancel(l.ctx), TraceLeaseData{Event: LeaseHeartbeatFailed, Store: k.storeName, Err: err})
		}
	}
}
