package idem

import (
	"context"
	"errors"
	"log/slog"
	"sync"
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

	mu      sync.Mutex
	leases  leaseList
	ticks   int64 // ticks of the loop so far: the keeper's cheap clock
	running bool
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
	cancel context.CancelCauseFunc

	// Guarded by keeper.mu.
	prev, next *lease
	kept       bool  // in the keeper's list
	due        int64 // the keeper tick at which the next extension is due
	extending  bool  // an Extend call is under way
	lost       bool  // the store refused an extension
}

func newKeeper(store Store, interval time.Duration, logger *slog.Logger) *keeper {
	return &keeper{store: store, interval: interval, logger: logger}
}

// ticksPerBeat is how many ticks make one heartbeat interval.
const ticksPerBeat = 4

// tick is how often the keeper looks for due leases: a quarter of the
// interval, so an extension is at most that late (the lease itself lasts
// three intervals by default).
func (k *keeper) tick() time.Duration {
	return max(k.interval/ticksPerBeat, time.Millisecond)
}

// add starts keeping the lease of (op, token) alive.
func (k *keeper) add(op Operation, token int64, duration time.Duration, cancel context.CancelCauseFunc) *lease {
	l := &lease{
		params: ExtendParams{Tenant: op.Tenant, Key: op.Key, Token: token, Lease: duration},
		cancel: cancel,
		kept:   true,
	}
	k.mu.Lock()
	// Due after a whole interval at least: the tick under way may be
	// almost over, so count from the next one.
	l.due = k.ticks + 1 + ticksPerBeat
	k.leases.push(l)
	if !k.running {
		k.running = true
		go k.loop()
	}
	k.mu.Unlock()
	return l
}

// remove stops keeping l and reports whether its lease was found lost.
func (k *keeper) remove(l *lease) (lost bool) {
	k.mu.Lock()
	k.leases.remove(l)
	l.kept = false
	lost = l.lost
	k.mu.Unlock()
	return lost
}

// loop runs while there are leases to keep. It lingers one interval after
// the last one left, so that a steady trickle of short requests does not
// start a goroutine each.
func (k *keeper) loop() {
	ticker := time.NewTicker(k.tick())
	defer ticker.Stop()
	idleTicks := 0
	for range ticker.C {
		k.mu.Lock()
		k.ticks++
		if k.leases.n == 0 {
			if idleTicks++; idleTicks > ticksPerBeat {
				k.running = false
				k.mu.Unlock()
				return
			}
		} else {
			idleTicks = 0
		}
		for l := k.leases.head; l != nil; l = l.next {
			if l.extending || l.lost || k.ticks < l.due {
				continue
			}
			l.extending = true
			go k.extend(l)
		}
		k.mu.Unlock()
	}
}

// extend runs one Extend call for l, outside the keeper's lock so that a
// slow store delays no other lease.
func (k *keeper) extend(l *lease) {
	ctx, cancel := context.WithTimeout(context.Background(), k.interval)
	err := k.store.Extend(ctx, l.params)
	cancel()

	k.mu.Lock()
	defer k.mu.Unlock()
	l.extending = false
	if !l.kept {
		return // the handler finished meanwhile
	}
	switch {
	case errors.Is(err, ErrLeaseLost):
		l.lost = true
		l.cancel(ErrLeaseLost)
	case err != nil:
		// A store hiccup: the lease still runs for a while; try again at
		// the next tick rather than waiting a whole interval.
		k.logger.Warn("idem: lease heartbeat failed", slog.String("key", l.params.Key), slog.Any("error", err))
		l.due = k.ticks + 1
	default:
		l.due = k.ticks + ticksPerBeat
	}
}
