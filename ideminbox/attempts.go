package ideminbox

import (
	"container/list"
	"slices"
	"sync"
)

// localAttempts is what one process remembers of the deliveries of
// messages it has not settled yet, to count attempts of the handler rather
// than deliveries of the broker:
//
//   - for brokers that do not number deliveries (a RabbitMQ classic queue
//     only says "redelivered"), the handler's failures: a poison message
//     then takes at most MaxAttempts deliveries per instance, and a
//     consumer that crashes on it starts over;
//   - for brokers that do, the deliveries that ended without the handler
//     failing (answered Hold or Nack because the store was down, the key
//     in flight, or the consumer shutting down), which are taken off the
//     broker's number when an adapter had to give such a delivery back;
//   - the store failures met by the delivery in hand, to tell a store that
//     is down from one that refuses this message.
//
// It lives in this process only: lost on restart and not shared between
// competing instances. The adapters hold a delivery instead of giving it
// back, so that the broker's number rarely needs correcting.
type localAttempts struct {
	mu    sync.Mutex
	limit int
	order *list.List // of *localEntry, least recently touched first
	byKey map[string]*list.Element
}

type localEntry struct {
	key      string
	failures int
	// unrun are delivery numbers that ended without a handler failure,
	// oldest first, at most maxUnrun of them.
	unrun []int
	// storeFailures counts the store failures of delivery storeDelivery
	// since the store was last seen down (storeEpoch).
	storeDelivery int
	storeFailures int
	storeEpoch    uint64
	// storeAllRan is whether the handler ran before each of those
	// failures.
	storeAllRan bool
}

// maxUnrun bounds the deliveries remembered per message.
const maxUnrun = 64

func newLocalAttempts(limit int) *localAttempts {
	return &localAttempts{limit: limit, order: list.New(), byKey: make(map[string]*list.Element)}
}

// update runs fn on key's entry, created if missing, under the lock.
func (l *localAttempts) update(key string, fn func(e *localEntry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, ok := l.byKey[key]; ok {
		l.order.MoveToBack(el)
		fn(el.Value.(*localEntry))
		return
	}
	for l.order.Len() >= l.limit {
		oldest := l.order.Front()
		l.order.Remove(oldest)
		delete(l.byKey, oldest.Value.(*localEntry).key)
	}
	e := &localEntry{key: key}
	l.byKey[key] = l.order.PushBack(e)
	fn(e)
}

// read runs fn on key's entry, or on an empty one, under the lock.
func (l *localAttempts) read(key string, fn func(e *localEntry)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, ok := l.byKey[key]; ok {
		fn(el.Value.(*localEntry))
		return
	}
	fn(&localEntry{key: key})
}

// attempt returns the handler attempt that delivery (the broker's number,
// 0 when it keeps none) stands for.
func (l *localAttempts) attempt(key string, delivery int) (n int) {
	l.read(key, func(e *localEntry) {
		if delivery <= 0 {
			n = e.failures + 1
			return
		}
		n = delivery
		for _, d := range e.unrun {
			if d < delivery {
				n--
			}
		}
	})
	return n
}

// fail counts a handler failure of a message whose broker keeps no count.
func (l *localAttempts) fail(key string) {
	l.update(key, func(e *localEntry) { e.failures++ })
}

// unrun records that delivery ended, or may end, without the handler
// failing on it.
func (l *localAttempts) unrun(key string, delivery int) {
	if delivery <= 0 {
		return
	}
	l.update(key, func(e *localEntry) {
		if slices.Contains(e.unrun, delivery) {
			return
		}
		if len(e.unrun) == maxUnrun {
			e.unrun = slices.Delete(e.unrun, 0, 1)
		}
		e.unrun = append(e.unrun, delivery)
	})
}

// ran records that the handler ran and failed on delivery: it counts.
func (l *localAttempts) ran(key string, delivery int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, ok := l.byKey[key]; ok {
		e := el.Value.(*localEntry)
		e.unrun = slices.DeleteFunc(e.unrun, func(d int) bool { return d == delivery })
		e.storeFailures = 0
	}
}

// storeFailure counts a store failure of delivery, met after the handler
// ran or not, and returns how many it met in a row while the store was
// never seen down (epoch unchanged), and whether the handler ran before
// each of them.
func (l *localAttempts) storeFailure(key string, delivery int, epoch uint64, ran bool) (n int, allRan bool) {
	l.update(key, func(e *localEntry) {
		if e.storeDelivery != delivery || e.storeEpoch != epoch || e.storeFailures == 0 {
			e.storeDelivery, e.storeEpoch, e.storeFailures, e.storeAllRan = delivery, epoch, 0, true
		}
		e.storeFailures++
		e.storeAllRan = e.storeAllRan && ran
		n, allRan = e.storeFailures, e.storeAllRan
	})
	return n, allRan
}

// forget drops what is known of a message that was settled for good.
func (l *localAttempts) forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, ok := l.byKey[key]; ok {
		l.order.Remove(el)
		delete(l.byKey, key)
	}
}
