package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// keeper extends the leases of every running handler of one engine. One
// goroutine serves all of them, so that a request costs a map insert and a
// delete rather than a timer of its own: most handlers finish long before
// their first beat is due, and they should not pay for it.
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
	leases  leaseList
	ticks   int64 // ticks of the loop so far: the keeper's cheap clock
	running bool
	closed  bool          // Engine.Close stopped the keeper
	stop    chan struct{} // closed by Engine.Close
	loops   sync.WaitGroup
}

// leaseList is an intrusive doubly linked list: adding and removing a
// lease costs a few pointer writes, with no hashing and no growth.
type leaseList struct {
	head *lease
	n    int
}

func (ll *leaseList) push(l *lease) {
	l.next = ll.head
	if ll.head != nil {
		ll.head.prev = l
	}
	ll.head = l
	ll.n++
}

func (ll *leaseList) remove(l *lease) {
	if l.prev != nil {
		l.prev.next = l.next
	} else if ll.head == l {
		ll.head = l.next
	} else {
		return // not in the list
	}
	if l.next != nil {
		l.next.prev = l.prev
	}
	l.prev, l.next = nil, nil
	ll.n--
}

// lease is one running handler's claim as the keeper sees it.
type lease struct {
	params ExtendParams
	ctx    *runCtx

	// Guarded by keeper.mu.
	prev, next *lease
	kept       bool  // in the keeper's list
	due        int64 // the keeper tick at which the next extension is due
	extending  bool  // an Extend call is under way
	lost       bool  // the store refused an extension
}

func newKeeper(store Store, interval time.Duration, logger *slog.Logger) *keeper {
	return &keeper{store: store, interval: interval, logger: logger, stop: make(chan struct{})}
}

// ticksPerBeat is how many ticks make one heartbeat interval.
const ticksPerBeat = 4

// tick is how often the keeper looks for due leases: a quarter of the
// interval, so an extension is at most that late (the lease itself lasts
// three intervals by default).
func (k *keeper) tick() time.Duration {
	return max(k.interval/ticksPerBeat, time.Millisecond)
}

// leases recycles lease records: every protected request needs one, and
// most hold it for a few microseconds.
var leases = sync.Pool{New: func() any { return new(lease) }}

// free returns l to the pool. Only its last holder may: the handler's
// remove, or an extension that finished after it.
func (l *lease) free() {
	*l = lease{} // drop the references: the pool must not keep them alive
	leases.Put(l)
}

// add starts keeping the lease of (op, token) alive.
func (k *keeper) add(op Operation, token int64, duration time.Duration, ctx *runCtx) *lease {
	l := leases.Get().(*lease)
	l.params = ExtendParams{Tenant: op.Tenant, Key: op.Key, Token: token, Lease: duration}
	l.ctx = ctx
	l.kept = true
	k.mu.Lock()
	// Due after a whole interval at least: the tick under way may be
	// almost over, so count from the next one.
	l.due = k.ticks + 1 + ticksPerBeat
	k.leases.push(l)
	if !k.running && !k.closed {
		k.running = true
		k.loops.Add(1)
		go k.loop(k.tick())
	}
	k.mu.Unlock()
	return l
}

// remove stops keeping l and reports whether its lease was found lost.
// l must not be used afterwards: it is recycled, now or, when an
// extension is under way, by that extension once it ends.
func (k *keeper) remove(l *lease) (lost bool) {
	k.mu.Lock()
	k.leases.remove(l)
	l.kept = false
	lost = l.lost
	idle := !l.extending
	k.mu.Unlock()
	if idle {
		l.free()
	}
	return lost
}

// loop runs while there are leases to keep. It lingers one interval after
// the last one left, so that a steady trickle of short requests does not
// start a goroutine each, and ends at once when the engine is closed.
func (k *keeper) loop(tick time.Duration) {
	defer k.loops.Done()
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	idleTicks := 0
	for {
		select {
		case <-k.stop:
			return
		case <-ticker.C:
		}
		if !k.beat(&idleTicks) {
			return
		}
	}
}

// close stops the loop and waits for it. Leases still held are no longer
// extended: Engine.Close documents that it is called once no execution
// runs.
func (k *keeper) close() {
	k.mu.Lock()
	if !k.closed {
		k.closed = true
		close(k.stop)
	}
	k.mu.Unlock()
	k.loops.Wait()
}

// beat is one tick of the loop: it starts the extensions that are due and
// reports whether the loop should go on.
func (k *keeper) beat(idleTicks *int) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.ticks++
	if k.closed {
		k.running = false
		return false
	}
	if k.leases.n == 0 {
		if *idleTicks++; *idleTicks > ticksPerBeat {
			k.running = false
			return false
		}
	} else {
		*idleTicks = 0
	}
	for l := k.leases.head; l != nil; l = l.next {
		if l.extending || l.lost || k.ticks < l.due {
			continue
		}
		l.extending = true
		k.loops.Add(1)
		go k.extend(l)
	}
	return true
}

// extend runs one Extend call for l, outside the keeper's lock so that a
// slow store delays no other lease.
func (k *keeper) extend(l *lease) {
	defer k.loops.Done()
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
	if !l.kept {
		// The handler finished meanwhile and left l to this extension.
		l.free()
		k.mu.Unlock()
		return
	}
	failed := false
	var opCtx context.Context
	switch {
	case errors.Is(err, ErrLeaseLost):
		l.lost = true
		// Before the cancellation: a step that sees the context
		// cancelled must find the lease known lost (Step).
		l.ctx.exec.lost.Store(true)
		l.ctx.lose(ErrLeaseLost)
	case err != nil:
		// A store hiccup: the lease still runs for a while; try again at
		// the next tick rather than waiting a whole interval.
		k.logger.Warn("idem: lease heartbeat failed; retrying at the next tick", slog.String("store", k.storeName),
			slog.String("key", l.params.Key), errorAttr(err))
		l.due = k.ticks + 1
		failed, opCtx = true, l.ctx
	default:
		l.due = k.ticks + ticksPerBeat
	}
	k.mu.Unlock()
	if failed && k.leaseTracer != nil {
		// Outside the lock: a slow tracer must not stall the keeper. l
		// may be recycled by now, not the context taken from it.
		k.leaseTracer.TraceLease(context.WithoutCancel(opCtx), TraceLeaseData{Event: LeaseHeartbeatFailed, Store: k.storeName, Err: err})
	}
}

// runCtx is the context a handler runs under. It carries the execution's
// state (ExecutionFromContext, NotExecuted, RollbackWrites) and behaves as context.WithCancelCause(parent) would, cancelled
// with cause ErrLeaseLost when the lease is lost and without cause (that
// is, context.Canceled) once the handler has returned, but it creates
// that context only when something needs it: a call of Done (a database
// driver watching for cancellation, a derived context, context.AfterFunc),
// the loss of the lease, or a use after the handler returned. A handler
// that needs none of these, the common case on a fast store, then costs
// one small allocation instead of a cancelCtx, its cause function and
// their cancellation.
//
// Until then Err and Value are the parent's, which is what the cancelCtx
// would answer: it is cancelled only through its parent, with the
// parent's error and cause.
type runCtx struct {
	parent context.Context
	inner  atomic.Pointer[cancelCause] // nil until needed
	ended  atomic.Bool                 // the handler returned; set under mu

	mu sync.Mutex // serializes the creation of inner with ended

	exec execState // answered for execKey, before anything else
}

// cancelCause is a context made by context.WithCancelCause, with its
// cancel function.
type cancelCause struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newRunCtx(parent context.Context) *runCtx { return &runCtx{parent: parent} }

// need returns the cancellable context, creating it when it does not
// exist yet: cancelled at once when the handler has already returned.
func (c *runCtx) need() *cancelCause {
	if in := c.inner.Load(); in != nil {
		return in
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if in := c.inner.Load(); in != nil {
		return in
	}
	ctx, cancel := context.WithCancelCause(c.parent)
	in := &cancelCause{ctx: ctx, cancel: cancel}
	if c.ended.Load() {
		cancel(nil)
	}
	c.inner.Store(in)
	return in
}

// current returns the cancellable context when it exists or must: once
// the handler has returned, every answer is the cancelled one.
func (c *runCtx) current() *cancelCause {
	if in := c.inner.Load(); in != nil {
		return in
	}
	if c.ended.Load() {
		return c.need()
	}
	return nil
}

// lose cancels the handler's context with cause.
func (c *runCtx) lose(cause error) { c.need().cancel(cause) }

// end cancels the context when the handler has returned, as the cancel
// function of context.WithCancelCause would; when it was never created,
// it only marks it cancelled, for a goroutine that outlives the handler.
func (c *runCtx) end() {
	c.mu.Lock()
	c.ended.Store(true)
	in := c.inner.Load()
	c.mu.Unlock()
	if in != nil {
		in.cancel(nil)
	}
}

// Deadline implements context.Context.
func (c *runCtx) Deadline() (time.Time, bool) { return c.parent.Deadline() }

// Done implements context.Context.
func (c *runCtx) Done() <-chan struct{} { return c.need().ctx.Done() }

// Err implements context.Context.
func (c *runCtx) Err() error {
	if in := c.current(); in != nil {
		return in.ctx.Err()
	}
	return c.parent.Err()
}

// Value implements context.Context. The execution's state answers first;
// then, once the cancellable context exists, it answers, so that
// context.Cause and the contexts derived from this one find it.
func (c *runCtx) Value(key any) any {
	if _, ok := key.(execKey); ok {
		return &c.exec
	}
	if in := c.current(); in != nil {
		return in.ctx.Value(key)
	}
	return c.parent.Value(key)
}

// String names the context as context.WithCancelCause's does.
func (c *runCtx) String() string {
	if s, ok := c.parent.(interface{ String() string }); ok {
		return s.String() + ".WithCancel"
	}
	return "context.WithCancel"
}
