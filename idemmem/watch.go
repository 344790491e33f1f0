package idemmem

import (
	"context"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

var _ idem.Watcher = (*Store)(nil)

// watch is the subscriptions to one record: one channel, closed when the
// record completes, is released, taken over or purged, or when its lease
// ends, shared by every subscriber.
type watch struct {
	ch    chan struct{}
	refs  int         // subscribers that have not stopped
	timer *time.Timer // fires at the end of the lease
}

// closed is the channel of a record that has nothing to wait for.
var closed = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// Watch implements idem.Watcher: the channel is closed by the call that
// changes the record (Complete, Release, a takeover, Purge), or by a timer
// at the end of its lease. A record that is absent or complete gets a
// channel closed already. The lease's timer runs on the real clock, from
// the lease's end on the store's clock (Config.NowFunc). ctx is only
// checked on the way in: the subscription lasts until stop.
func (s *Store) Watch(ctx context.Context, tenant, key string) (<-chan struct{}, func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	sh, h := s.locate(tenant, key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, tenant, key)
	if e == nil || !e.inFlight() {
		return closed, func() {}, nil
	}
	w := sh.watches[e]
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		if sh.watches == nil {
			sh.watches = make(map[*entry]*watch)
		}
		sh.watches[e] = w
		e.watched = true
		w.timer = time.AfterFunc(e.at(e.lockedUntil).Sub(s.now()), func() { s.leaseTimer(sh, e, w) })
	}
	w.refs++
	var once sync.Once
	return w.ch, func() { once.Do(func() { s.unwatch(sh, e, w) }) }, nil
}

// leaseTimer closes w's channel when e's lease has ended, and sets the
// timer again when a heartbeat moved the end since: a heartbeat is no
// change a waiter cares about.
func (s *Store) leaseTimer(sh *shard, e *entry, w *watch) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.watches[e] != w {
		return
	}
	if left := e.at(e.lockedUntil).Sub(s.now()); left > 0 {
		w.timer.Reset(left)
		return
	}
	sh.changed(e)
}

// unwatch counts a subscriber of w out, and drops w after the last.
func (s *Store) unwatch(sh *shard, e *entry, w *watch) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	w.refs--
	if w.refs == 0 && sh.watches[e] == w {
		w.timer.Stop()
		delete(sh.watches, e)
		e.watched = false
	}
}

// changed tells e's subscribers that it changed, and forgets them: they
// watch again if they care. The caller holds the shard's lock.
func (sh *shard) changed(e *entry) {
	if !e.watched {
		return
	}
	w := sh.watches[e]
	w.timer.Stop()
	close(w.ch)
	delete(sh.watches, e)
	e.watched = false
}
