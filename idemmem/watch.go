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
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[recordKey{tenant, key}]
	if e == nil || !e.inFlight() {
		return closed, func() {}, nil
	}
	w := e.watch
	if w == nil {
		w = &watch{ch: make(chan struct{})}
		e.watch = w
		w.timer = time.AfterFunc(e.rec.LockedUntil.Sub(s.now()), func() { s.leaseTimer(e, w) })
	}
	w.refs++
	var once sync.Once
	return w.ch, func() { once.Do(func() { s.unwatch(e, w) }) }, nil
}

// leaseTimer closes w's channel when e's lease has ended, and sets the
// timer again when a heartbeat moved the end since: a heartbeat is no
// change a waiter cares about.
func (s *Store) leaseTimer(e *entry, w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e.watch != w {
		return
	}
	if left := e.rec.LockedUntil.Sub(s.now()); left > 0 {
		w.timer.Reset(left)
		return
	}
	s.changed(e)
}

// unwatch counts a subscriber of w out, and drops w after the last.
func (s *Store) unwatch(e *entry, w *watch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.refs--
	if w.refs == 0 && e.watch == w {
		w.timer.Stop()
		e.watch = nil
	}
}

// changed tells e's subscribers that it changed, and forgets them: they
// watch again if they care. The caller holds s.mu.
func (s *Store) changed(e *entry) {
	w := e.watch
	if w == nil {
		return
	}
	w.timer.Stop()
	close(w.ch)
	e.watch = nil
}
