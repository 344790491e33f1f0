package idemsql

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem"
)

var _ idem.Watcher = (*Store)(nil)

// watchers are the subscriptions of a Store's Watch.
type watchers struct {
	// n counts the subscriptions not stopped: Complete and Release look
	// no further while it is zero, which it is unless duplicates wait.
	n    atomic.Int64
	mu   sync.Mutex
	subs map[watchKey]map[*watchSub]struct{} // the ones not yet told
}

type watchKey struct{ tenant, key string }

type watchSub struct {
	k       watchKey
	ch      chan struct{}
	told    bool // guarded by watchers.mu
	stopped bool // guarded by watchers.mu
}

// Watch implements idem.Watcher within the process: the channel is closed
// when a completion or a release of the record made through this Store
// commits. SQLite is mostly written by one process, whose Store this is;
// the changes made by another Store or another process (MySQL servers
// shared by many) are not seen here, and the engine finds them by polling,
// a few times a second. ctx is only checked on the way in: the
// subscription lasts until stop.
func (s *Store) Watch(ctx context.Context, tenant, key string) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	w := &s.watch
	sub := &watchSub{k: watchKey{tenant, key}, ch: make(chan struct{})}
	w.mu.Lock()
	if w.subs == nil {
		w.subs = make(map[watchKey]map[*watchSub]struct{})
	}
	set := w.subs[sub.k]
	if set == nil {
		set = make(map[*watchSub]struct{})
		w.subs[sub.k] = set
	}
	set[sub] = struct{}{}
	w.n.Add(1)
	w.mu.Unlock()
	var once sync.Once
	return sub.ch, func() { once.Do(func() { w.stop(sub) }) }, nil
}

func (w *watchers) stop(sub *watchSub) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if sub.stopped {
		return
	}
	sub.stopped = true
	w.n.Add(-1)
	if !sub.told {
		set := w.subs[sub.k]
		delete(set, sub)
		if len(set) == 0 {
			delete(w.subs, sub.k)
		}
	}
}

// changed tells the subscribers of (tenant, key) that its record changed.
func (s *Store) changed(tenant, key string) {
	w := &s.watch
	if w.n.Load() == 0 {
		return
	}
	k := watchKey{tenant, key}
	w.mu.Lock()
	defer w.mu.Unlock()
	for sub := range w.subs[k] {
		sub.told = true
		close(sub.ch)
	}
	delete(w.subs, k)
}
