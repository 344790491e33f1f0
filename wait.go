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

// The poller of a waited key reads the record after a first pause, then
// doubles its pause after every read that changed nothing, up to
// Config.WaitPollInterval: a waiter learns of an end the store did not
// announce within a quarter of a second by default, and a key waited on
// for long costs four reads a second, whatever the number of its waiters.
const (
	// defaultWaitPollInterval is Config.WaitPollInterval's default.
	defaultWaitPollInterval = 250 * time.Millisecond
	// waitPollDivisor gives the first pause: WaitPollInterval/25, 10 ms
	// by default, so that an execution a few milliseconds long is found
	// ended at once by a store that does not announce it.
	waitPollDivisor = 25
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

// waitEnded is the error of a waiter whose context, or whose
// Operation.WaitContext, ended while it waited: it ran nothing, and is
// reported cancelled, not as a failed handler. It unwraps to the
// context's error.
type waitEnded struct{ err error }

func (w waitEnded) Error() string { return w.err.Error() }
func (w waitEnded) Unwrap() error { return w.err }

// isWaitEnded reports whether err is a waiter's whose wait was ended.
func isWaitEnded(err error) bool {
	var w waitEnded
	return errors.As(err, &w)
}

// waitInFlight is Do for a duplicate that met an execution of its
// operation in flight, with op.WaitInFlight set: it waits for news of the
// key, then answers as a retry would be answered at that moment: the
// stored answer when the execution completed, ErrFingerprintMismatch
// when the key now holds another request, a claim of its own when the
// key was released or its lease ended, ErrInFlight when op.WaitInFlight
// runs out first.
//
// Of the waiters of one engine, one claims a key found released; the
// others keep waiting, and learn from the poller what that claim led to
// (an execution in flight, which they wait for in turn, or a record to
// answer from): N duplicates behind a key released again and again cost
// N claims, not N²/2.
//
// lost is the record the duplicate's claim lost to: an execution the
// poller finds replaced by another is news, even at its first read.
func (e *Engine) waitInFlight(ctx context.Context, op Operation, lost *Record, fn func(ctx context.Context) (Result, error), t *opTrace) (Outcome, error) {
	deadline := time.NewTimer(op.WaitInFlight)
	defer deadline.Stop()
	w := &e.waits
	k := waitKey{op.Tenant, op.Key}
	kw, gen := w.join(e, k, lost.LeaseToken)
	in := true
	leave := func() {
		if in {
			in = false
			w.leave(k, kw)
		}
	}
	defer leave()
	for {
		rec, g, err := w.await(kw, ctx, op, gen, deadline.C)
		if err != nil {
			return Outcome{}, err
		}
		gen = g
		now := time.Now()
		switch {
		case rec != nil && rec.State == StateComplete && now.Before(rec.ExpiresAt):
			if !rec.SameFingerprint(op.Fingerprint) {
				return Outcome{}, ErrFingerprintMismatch
			}
			// The record is shared by every waiter of the key: each gets
			// a result of its own, which it may change.
			if t != nil {
				t.completedAt = rec.CompletedAt
			}
			return Outcome{Result: cloneResult(rec.Result), Replayed: true}, nil
		case rec != nil && rec.State == StateInFlight && !rec.SameFingerprint(op.Fingerprint):
			// Released, then claimed by another request: a retry would
			// get the mismatch, and so does the waiter.
			return Outcome{}, ErrFingerprintMismatch
		case rec != nil && rec.State == StateInFlight && now.Before(rec.LockedUntil):
			// Claimed again by this operation (another waiter, here or
			// in another process): wait for that execution.
			continue
		}
		// Released, gone, past its retention or its lease: claim again,
		// as a retry would, unless another waiter claims it already.
		if !w.takeClaim(kw, gen) {
			continue
		}
		out, done, err := e.waiterClaim(ctx, op, fn, t, kw, leave)
		if done {
			return out, err
		}
	}
}

// waiterClaim is the claim of the waiter that took the key's turn, and
// what follows it: the run when won (done), the answer when lost to a
// record that is not to wait for (done), or nothing when lost to an
// execution of the operation in flight, which the waiter waits for.
// leave counts the waiter out of the key's waiters before it runs.
func (e *Engine) waiterClaim(ctx context.Context, op Operation, fn func(ctx context.Context) (Result, error), t *opTrace, kw *keyWait, leave func()) (out Outcome, done bool, err error) {
	if e.closed.Load() {
		e.waits.claimDone(kw, true)
		return Outcome{}, true, ErrClosed
	}
	token := newToken()
	claim, err := e.claim(ctx, e.claimParams(op, token))
	// The others learn what the claim led to from the poller's next read,
	// made at once, unless the claim lost to the execution they wait for
	// already (the store's clock says its lease runs on): read at once,
	// again and again, it would turn a clock ahead of the store's into a
	// loop of claims.
	e.waits.claimDone(kw, err != nil || claim.Won || !waitable(claim.Record, op.Fingerprint))
	if err != nil {
		if !errors.Is(err, ErrNotApplied) {
			e.late.start(ctx, ReleaseParams{Tenant: op.Tenant, Key: op.Key, Token: token})
		}
		return Outcome{}, true, storeError("claim", err)
	}
	if claim.Won {
		// Running, it no longer waits: the poller must not outlive the
		// last of the others for it.
		leave()
		if claim.Takeover {
			if t != nil {
				t.takeover = true
			}
			e.tookOver(ctx, op, &claim)
		}
		out, err := e.run(ctx, op, token, &claim, nil, fn, t)
		return out, true, err
	}
	if waitable(claim.Record, op.Fingerprint) {
		return Outcome{}, false, nil
	}
	if t != nil && claim.Record != nil {
		t.completedAt = claim.Record.CompletedAt
	}
	out, err = decide(claim.Record, op.Fingerprint)
	return out, true, err
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
	// first and most replace the pauses Config.WaitPollInterval gives
	// when set, for the tests.
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
	gen     uint64        // publications made
	seen    chan struct{} // closed, and replaced, at each publication
	rec     *Record       // what was published last; nil: no record
	// claiming is true while a waiter claims the key for the others;
	// claimGen is the last publication such a claim answered: a waiter
	// woken by it does not claim again.
	claiming bool
	claimGen uint64

	// kick wakes the poller for a read at once: a waiter's claim ended.
	kick chan struct{}

	ctx    context.Context // the poller's; ends with the last waiter
	cancel context.CancelFunc
}

// join counts a waiter in on k, starting its poller when it is the first,
// and returns the key's wait and the publication the waiter has seen.
// token is the execution in flight the waiter lost its claim to; a poller
// started here compares its first read with it.
func (w *waitRoom) join(e *Engine, k waitKey, token int64) (*keyWait, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kw := w.keys[k]
	if kw == nil {
		if w.keys == nil {
			w.keys = make(map[waitKey]*keyWait)
		}
		kw = &keyWait{seen: make(chan struct{}), kick: make(chan struct{}, 1)}
		kw.ctx, kw.cancel = context.WithCancel(context.Background())
		w.keys[k] = kw
		w.pollers.Add(1)
		go e.poll(kw, k.tenant, k.key, token)
	}
	kw.waiters++
	if w.closing == nil {
		w.closing = make(chan struct{})
	}
	return kw, kw.gen
}

// await waits as one waiter of op's key until the poller publishes news
// of the record newer than publication gen, and returns it (nil when
// there is no record) with its number. It returns a waitEnded when ctx or
// op.WaitContext ends first, ErrInFlight at the deadline, and ErrClosed
// once the engine is closed.
func (w *waitRoom) await(kw *keyWait, ctx context.Context, op Operation, gen uint64, deadline <-chan time.Time) (*Record, uint64, error) {
	w.mu.Lock()
	if kw.gen > gen {
		rec, g := kw.rec, kw.gen
		w.mu.Unlock()
		return rec, g, nil
	}
	seen, closing := kw.seen, w.closing
	w.mu.Unlock()

	var abandoned <-chan struct{}
	if op.WaitContext != nil {
		abandoned = op.WaitContext.Done()
	}
	select {
	case <-seen:
		w.mu.Lock()
		defer w.mu.Unlock()
		return kw.rec, kw.gen, nil
	case <-ctx.Done():
		return nil, 0, waitEnded{ctx.Err()}
	case <-abandoned:
		return nil, 0, waitEnded{op.WaitContext.Err()}
	case <-deadline:
		return nil, 0, ErrInFlight
	case <-closing:
		return nil, 0, ErrClosed
	}
}

// takeClaim gives the key's turn to claim to the waiter that read
// publication gen, unless another waiter claims already or a claim
// answered gen.
func (w *waitRoom) takeClaim(kw *keyWait, gen uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if kw.claiming || gen <= kw.claimGen {
		return false
	}
	kw.claiming = true
	return true
}

// claimDone ends the turn takeClaim gave and, with kick, has the poller
// read the record at once, for the waiters that did not claim.
func (w *waitRoom) claimDone(kw *keyWait, kick bool) {
	w.mu.Lock()
	kw.claiming = false
	kw.claimGen = kw.gen
	w.mu.Unlock()
	if !kick {
		return
	}
	select {
	case kw.kick <- struct{}{}:
	default:
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

// publish hands rec to every waiter of kw. A record to claim again (none,
// or one whose lease or retention ended) is not published while a waiter
// claims: that claim's outcome is the news, and the poller reads it as
// soon as the claim ends.
func (w *waitRoom) publish(kw *keyWait, rec *Record, claimable bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if claimable && kw.claiming {
		return
	}
	kw.rec = rec
	kw.gen++
	close(kw.seen)
	kw.seen = make(chan struct{})
}

// pollPauses returns the first and the longest pause of e's pollers.
func (e *Engine) pollPauses() (first, most time.Duration) {
	if e.waits.first > 0 {
		return e.waits.first, e.waits.most
	}
	most = e.config.WaitPollInterval
	if most <= 0 {
		most = defaultWaitPollInterval
	}
	return max(most/waitPollDivisor, time.Millisecond), most
}

// pollRead reads what the poller needs of the record of (tenant, key):
// its state alone when the store is a StateReader, the whole record once
// it is complete (its waiters replay its result). The reads are traced
// as StoreGet.
func (e *Engine) pollRead(ctx context.Context, tenant, key string) (*Record, error) {
	if sr, ok := e.store.(StateReader); ok {
		rec, err := e.traceGet(ctx, func(ctx context.Context) (*Record, error) { return sr.GetState(ctx, tenant, key) })
		if err != nil || rec.State != StateComplete {
			return rec, err
		}
	}
	return e.traceGet(ctx, func(ctx context.Context) (*Record, error) { return e.store.Get(ctx, tenant, key) })
}

// traceGet runs get, a read of a record, under the StoreTracer when there
// is one.
func (e *Engine) traceGet(ctx context.Context, get func(ctx context.Context) (*Record, error)) (*Record, error) {
	if e.storeTracer == nil {
		return get(ctx)
	}
	ctx, s := startStore(ctx, e.storeTracer, StoreGet, e.info.Name)
	rec, err := get(ctx)
	s.end(ctx, err)
	return rec, err
}

// poll reads the record of (tenant, key) for its waiters until the last
// one leaves, and publishes what may let them go on: no record, a
// completed one, one whose lease has ended (on this machine's clock; the
// claim that follows asks the store's), or an execution other than the
// one it read before (a takeover, a waiter's claim, another request's).
// When the store is a Watcher it reads as soon as the store says the
// record changed, and keeps polling behind it all the same: a
// notification lost on the way must cost a waiter a poll, not its whole
// wait.
//
// token is the execution in flight the first waiter lost its claim to.
func (e *Engine) poll(kw *keyWait, tenant, key string, token int64) {
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
	first, most := e.pollPauses()
	pause := first
	// token is the execution in flight read last (0: none), known whether
	// there is one to compare with.
	known := token != 0
	fires := 0
	for {
		if watcher != nil && unwatch == nil {
			// Subscribed before the read, so that a change between the
			// two is not missed. The timeout bounds the subscribing; the
			// subscription lasts until drop.
			wctx, cancel := context.WithTimeout(ctx, watchTimeout)
			ch, stop, err := watcher.Watch(wctx, tenant, key)
			cancel()
			if err == nil {
				changed, unwatch = ch, stop
			}
		}
		rec, err := e.pollRead(ctx, tenant, key)
		if ctx.Err() != nil {
			return
		}
		news, claimable := false, false
		now := time.Now()
		switch {
		case errors.Is(err, ErrNotFound):
			news, claimable, rec = true, true, nil
		case err != nil:
			// The store failed (the tracer saw it): read again later; the
			// waiters give up at their deadline if it does not come back.
		case rec.State == StateComplete:
			news, claimable = true, !now.Before(rec.ExpiresAt)
		case !now.Before(rec.LockedUntil):
			news, claimable = true, true
		case known && rec.LeaseToken != token:
			// Another execution holds the key now: the waiters wait for
			// it when it runs their operation, and answer the mismatch
			// when it runs another request.
			news = true
		}
		if err == nil || errors.Is(err, ErrNotFound) {
			known = true
			token = 0
			if rec != nil && rec.State == StateInFlight {
				token = rec.LeaseToken
			}
		}
		if news {
			// Published, the waiters now claim again, wait again or leave;
			// not published, a waiter claims and the poller is kicked once
			// it has. Either way the record to watch next, if any, may be a
			// new one: watch that one.
			e.waits.publish(kw, rec, claimable)
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
			case <-kw.kick:
				timer.Stop()
			case <-ctx.Done():
				return
			}
		case <-kw.kick:
			timer.Stop()
			pause = first
		case <-timer.C:
			pause = min(2*pause, most)
		case <-ctx.Done():
			return
		}
	}
}
