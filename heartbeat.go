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
	leases  map[*lease]struct{}
	running bool
}

// lease is one running handler's claim as the keeper sees it.
type lease struct {
	params ExtendParams
	cancel context.CancelCauseFunc

	// Guarded by keeper.mu.
	due       time.Time // next extension, on the monotonic clock
	extending bool      // an Extend call is under way
	lost      bool      // the store refused an extension
}

func newKeeper(store Store, interval time.Duration, logger *slog.Logger) *keeper {
	return &keeper{store: store, interval: interval, logger: logger, leases: make(map[*lease]struct{})}
}

// tick is how often the keeper looks for due leases: a quarter of the
// interval, so an extension is at most that late (the lease itself lasts
// three intervals by default).
func (k *keeper) tick() time.Duration {
	return max(k.interval/4, time.Millisecond)
}

// add starts keeping the lease of (op, token) alive.
func (k *keeper) add(op Operation, token int64, duration time.Duration, cancel context.CancelCauseFunc) *lease {
	l := &lease{
		params: ExtendParams{Tenant: op.Tenant, Key: op.Key, Token: token, Lease: duration},
		cancel: cancel,
		due:    time.Now().Add(k.interval),
	}
	k.mu.Lock()
	k.leases[l] = struct{}{}
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
	delete(k.leases, l)
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
	idleSince := time.Time{}
	for now := range ticker.C {
		k.mu.Lock()
		if len(k.leases) == 0 {
			if idleSince.IsZero() {
				idleSince = now
			} else if now.Sub(idleSince) >= k.interval {
				k.running = false
				k.mu.Unlock()
				return
			}
		} else {
			idleSince = time.Time{}
		}
		for l := range k.leases {
			if l.extending || l.lost || now.Before(l.due) {
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
	if _, kept := k.leases[l]; !kept {
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
		l.due = time.Now().Add(k.tick())
	default:
		l.due = time.Now().Add(k.interval)
	}
}
