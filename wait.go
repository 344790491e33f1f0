package idem

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The poller of a waited key reads the record after waitPollFirst, then
// doubles its pause after every read that changed nothing, up to
// waitPollMax: a waiter learns of an end the store did not announce within
// a quarter of a second, and a key waited on for long costs four reads a
// second, whatever the number of its waiters.
const (
	waitPollFirst = 10 * time.Millisecond
	waitPollMax   = 250 * time.Millisecond
	// watchTimeout bounds a Watch call: past it, the poller reads without
	// the watcher for one round rather than leave every waiter without
	// news.
	watchTimeout = time.Second
	// quietFires is how many closes of a watcher's channel in a row that
	// bring nothing new the poller takes before it pauses: a store whose
	// channel closes at once, again and again, must not turn the poller
	// into a loop of reads.
	quietFires = 3
)

// waitable reports whether a lost claim may be waited on: the record is
// an execution of the same operation in flight.
func waitable(rec *Record, fingerprint []byte) bool {
	return rec != nil && rec.State == StateInFlight && rec.SameFingerprint(fingerprint)
}

// waitInFlight is Do for a duplicate that met an execution of its
// operation in flight, with op.WaitInFlight set: it waits for news of the
// key, then answers as a retry would be answered at that moment: the
// stored answer when the execution completed, a claim of its own when the
// key was released or its lease ended (and a wait again when another
// duplicate won that claim), ErrInFlight when op.WaitInFlight runs out
// first.
func (e *Engine) waitInFlight(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error), t *opTrace) (Outcome, error) {
	deadline := time.NewTimer(op.WaitInFlight)
	defer deadline.Stop()
	for {
		rec, err := e.waits.await(e, ctx, op, deadline.C)
		if err != nil {
			return Outcome{}, err
		}
		if rec != nil && rec.State == StateComplete && time.Now().Before(rec.ExpiresAt) {
			if !rec.SameFingerprint(op.Fingerprint) {
				return Outcome{}, ErrFingerprintMismatch
			}
			// The record is shared by every waiter of the key: each gets
			// a result of its own, which it may change.
			if t != nil {
				t.completedAt = rec.CompletedAt
			}
			return Outcome{Result: cloneResult(rec.Result), Replayed: true}, nil
		}
		if rec != nil && rec.State == StateInFlight && !rec.SameFingerprint(op.Fingerprint) {
			return Outcome{}, ErrFingerprintMismatch
		}
		// Released, gone, past its lease or taken over: claim again, as a
		// retry would, and run if the claim is won.
		if e.closed.Load() {
			return Outcome{}, ErrClosed
		}
		token := newToken()
		claim, err := e.claim(ctx, e.claimParams(op, token))
		if err != nil {
			if !errors.Is(err, ErrNotApplied) {
				e.late.start(ctx, ReleaseParams{Tenant: op.Tenant, Key: op.Key, Token: token})
			}
			return Outcome{}, storeError("claim", err)
		}
		if claim.Won {
			return e.run(ctx, op, token, &claim, nil, fn, t)
		}
		if !waitable(claim.Record, op.Fingerprint) {
			return decide(claim.Record, op.Fingerprint)
		}
	}
}

// claimParams are Do's claim of op under token.
func (e *Engine) claimParams(op Operation, token int64) ClaimParams {
	return ClaimParams{
		Tenant:      op.Tenant,
		Key:         op.Key,
		Fingerprint: op.Fingerprint,
		Token:       token,
		Lease:       e.config.Lease,
		// Never shorter than the lease: a record past retention counts
		// as absent, so a retry would take over a key still held.
		Retention: max(e.config.Retention, e.config.Lease),
	}
}

// cloneResult returns a copy of r that shares nothing mutable with it.
func cloneResult(r Result) Result {
	if r.Header != nil {
		h := make(map[string][]string, len(r.Header))
		for k, v := range r.Header {
			h[k] = slices.Clone(v)
		}
		r.Header = h
	}
	if r.Body != nil {
		r.Body = bytes.Clone(r.Body)
	}
	return r
}

// waitRoom holds the duplicates waiting in one engine, by key. Every
// waiter of a key shares one poller, which reads the record and publishes
// what it finds: a thousand duplicates of one request cost one read per
// poll, not a thousand. The zero value is ready to use.
type waitRoom struct {
	mu   sync.Mutex
	keys map[waitKey]*keyWait
	// pollers counts the pollers started, for the tests.
	pollers atomic.Int64
	// first and most replace waitPollFirst and waitPollMax when set, for
	// the tests.
	first, most time.Duration
	// closing is closed by Engine.Close: the waiters stop. Guarded by mu,
	// made at the first wait or at Close.
	closing chan struct{}
	closed  bool
}

// close stops every waiter, now and to come.
func (w *waitRoom) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	if w.closing == nil {
		w.closing = make(chan struct{})
	}
	close(w.closing)
}

type waitKey struct{ tenant, key string }

// keyWait is the waiting on one key: its waiters, and what its poller
// found last.
type keyWait struct {
	// Guarded by waitRoom.mu.
	waiters int
	seen    chan struct{} // closed, and replaced, at each publication
	rec     *Record       // what was published last; nil: no record

	ctx    context.Context // the poller's; ends with the last waiter
	cancel context.CancelFunc
}

// await waits as one waiter of op's key until the poller publishes news
// of the record, and returns it (nil when there is no record). It returns
// ctx's or op.WaitContext's error when one of them ends first, ErrInFlight
// at the deadline, and ErrClosed once the engine is closed.
func (w *waitRoom) await(e *Engine, ctx context.Context, op Operation, deadline <-chan time.Time) (*Record, error) {
	k := waitKey{op.Tenant, op.Key}
	w.mu.Lock()
	kw := w.keys[k]
	if kw == nil {
		if w.keys == nil {
			w.keys = make(map[waitKey]*keyWait)
		}
		kw = &keyWait{seen: make(chan struct{})}
		kw.ctx, kw.cancel = context.WithCancel(context.Background())
		w.keys[k] = kw
		w.pollers.Add(1)
		go e.poll(kw, op.Tenant, op.Key)
	}
	kw.waiters++
	seen := kw.seen
	if w.closing == nil {
		w.closing = make(chan struct{})
	}
	closing := w.closing
	w.mu.Unlock()
	defer w.leave(k, kw)

	var abandoned <-chan struct{}
	if op.WaitContext != nil {
		abandoned = op.WaitContext.Done()
	}
	select {
	case <-seen:
		w.mu.Lock()
		rec := kw.rec
		w.mu.Unlock()
		return rec, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-abandoned:
		return nil, op.WaitContext.Err()
	case <-deadline:
		return nil, ErrInFlight
	case <-closing:
		return nil, ErrClosed
	}
}

// leave counts a waiter out, and stops the poller after the last.
func (w *waitRoom) leave(k waitKey, kw *keyWait) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kw.waiters--
	if kw.waiters == 0 {
		delete(w.keys, k)
		kw.cancel()
	}
}

// publish hands rec to every waiter of kw.
func (w *waitRoom) publish(kw *keyWait, rec *Record) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kw.rec = rec
	close(kw.seen)
	kw.seen = make(chan struct{})
}

// poll reads the record of (tenant, key) for its waiters until the last
// one leaves, and publishes what may let them go on: no record, a
// completed one, one whose lease has ended (on this machine's clock; the
// claim that follows asks the store's), or one taken over by another
// execution. When the store is a Watcher it reads as soon as the store
// says the record changed, and keeps polling behind it all the same: a
// notification lost on the way must cost a waiter a poll, not its whole
// wait.
func (e *Engine) poll(kw *keyWait, tenant, key string) {
	ctx := kw.ctx
	watcher, _ := e.store.(Watcher)
	var changed <-chan struct{}
	var unwatch func()
	defer func() {
		if unwatch != nil {
			unwatch()
		}
	}()
	drop := func() {
		if unwatch != nil {
			unwatch()
		}
		changed, unwatch = nil, nil
	}
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	first, most := waitPollFirst, waitPollMax
	if e.waits.first > 0 {
		first, most = e.waits.first, e.waits.most
	}
	pause := first
	var token int64 // of the execution in flight seen last; 0: none
	fires := 0
	for {
		if watcher != nil && unwatch == nil {
			// Subscribed before the read, so that a change between the
			// two is not missed.
			wctx, cancel := context.WithTimeout(ctx, watchTimeout)
			ch, stop, err := watcher.Watch(wctx, tenant, key)
			cancel()
			if err == nil {
				changed, unwatch = ch, stop
			}
		}
		rec, err := e.store.Get(ctx, tenant, key)
		if ctx.Err() != nil {
			return
		}
		news := false
		switch {
		case errors.Is(err, ErrNotFound):
			news, rec = true, nil
		case err != nil:
			// The store failed: read again later; the waiters give up at
			// their deadline if it does not come back.
		case rec.State != StateInFlight, !time.Now().Before(rec.LockedUntil):
			news = true
		case token != 0 && rec.LeaseToken != token:
			news = true
		}
		if err == nil && rec != nil && rec.State == StateInFlight {
			token = rec.LeaseToken
		} else {
			token = 0
		}
		if news {
			e.waits.publish(kw, rec)
			// The waiters now claim again or leave; the record they will
			// wait on next, if any, is a new one: watch that one.
			drop()
			fires = 0
		}
		timer.Reset(pause)
		select {
		case <-changed:
			timer.Stop()
			drop()
			fires++
			if fires < quietFires {
				pause = first
				continue
			}
			// Closed again and again with nothing new: wait for the timer
			// as if unwatched this round.
			fires = 0
			timer.Reset(pause)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		case <-timer.C:
			pause = min(2*pause, most)
		case <-ctx.Done():
			return
		}
	}
}
