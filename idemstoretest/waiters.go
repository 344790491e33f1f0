package idemstoretest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// waitersAtOnce is how many duplicates the counting cases release at one
// barrier.
const waitersAtOnce = 20

// waitCounted: what the waiters cost the store, counted, and what they
// answer when the first execution is replaced by another request. Part of
// the Wait area.
func (s *suite) waitCounted(t *testing.T) {
	s.parallel(t, "WokenByWatcher", func(h *harness) {
		if h.caps.SingleTransaction {
			h.t.Skip("single-transaction mode: a duplicate waits on the key's lock in the database, not on the watcher")
		}
		// The poll is an hour apart: a waiter answered at all was woken
		// by the store's announcement of the completion, not by a poll.
		h.requireWatcher()
		var tr countingTracer
		e := h.engines(&idem.Config{Tracer: &tr, WaitPollInterval: time.Hour})[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders")}
		running, release := h.holdInFlight(e, op)
		<-running
		op.WaitInFlight = 20 * time.Second
		done := make(chan error, 1)
		var out idem.Outcome
		go func() {
			var err error
			out, err = e.Do(h.ctx, op, h.mustNotRun)
			done <- err
		}()
		// The poller subscribes, then reads: once it has read, a
		// completion is announced to it.
		tr.waitReads(h, 1)
		release()
		if err := <-done; err != nil || !out.Replayed {
			h.t.Fatalf("waiter = %+v, %v; want the completion replayed, announced by the store (the next poll is an hour away)", out, err)
		}
		// The first read, the one the announcement caused, and the read of
		// the result: no poll came between.
		if n := tr.reads.Load(); n > 3 {
			h.t.Errorf("the waiter cost %d reads of the record; want at most 3 (read, woken, read the result)", n)
		}
	})

	s.parallel(t, "ReleasedKeyClaimedOnce", func(h *harness) {
		// Every execution fails and releases the key: each waiter runs in
		// its turn. One waiter per engine claims a released key, the
		// others wait for its execution: the claims grow with the
		// waiters, not with their square.
		var tr countingTracer
		engines := h.engines(&idem.Config{Tracer: &tr})
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders"), WaitInFlight: 30 * time.Second}
		failure := errors.New("every execution fails")
		var ran atomic.Int32
		fn := func(ctx context.Context) (idem.Result, error) {
			// The first long enough for every duplicate to meet it in
			// flight; the others long enough for the claims made beside
			// them to meet them in flight too.
			d := waitHandler / 20
			if ran.Add(1) == 1 {
				d = waitHandler
			}
			if err := sleepCtx(ctx, d); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{}, failure
		}
		errs := make([]error, waitersAtOnce)
		atOnce(waitersAtOnce, func(i int) {
			_, errs[i] = engines[i%len(engines)].Do(h.ctx, op, fn)
		})
		for i, err := range errs {
			if !errors.Is(err, failure) {
				h.t.Errorf("duplicate %d: %v; want its own execution's failure", i, err)
			}
		}
		// Each Do claims once at the barrier and once in its turn; a few
		// claims more are lost to a claim made meanwhile by a waiter of
		// another engine. Every waiter claiming at every release made it
		// about waitersAtOnce²/2.
		claims := tr.claims.Load()
		limit := int64(waitersAtOnce * (2 + len(engines)))
		if n := ran.Load(); n != waitersAtOnce {
			h.t.Errorf("fn ran %d times; want %d, once per duplicate", n, waitersAtOnce)
		}
		if claims > limit {
			h.t.Fatalf("%d duplicates behind a key released after every execution made %d claims; want at most %d", waitersAtOnce, claims, limit)
		}
		h.t.Logf("%d duplicates, %d engines: %d claims", waitersAtOnce, len(engines), claims)
	})

	s.parallel(t, "LostToAnotherRequest", func(h *harness) {
		// The first execution is released and another request claims the
		// key before the waiter's poller reads anything: the waiter gets
		// the mismatch a retry would get, not a wait until its limit.
		gate := newGatedStore(h.fx.Store)
		e, err := idem.NewEngine(gate, &idem.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			h.t.Fatal(err)
		}
		h.t.Cleanup(func() { _ = e.Close(context.Background()) })
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders")}
		stop := make(chan struct{})
		first := make(chan error, 1)
		running := make(chan struct{})
		failure := errors.New("the first execution fails")
		go func() {
			_, err := e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
				close(running)
				<-stop
				return idem.Result{}, failure
			})
			first <- err
		}()
		<-running
		waiter := op
		waiter.WaitInFlight = 20 * time.Second
		done := make(chan error, 1)
		go func() {
			_, err := e.Do(h.ctx, waiter, h.mustNotRun)
			done <- err
		}()
		gate.waitRead(h)
		close(stop)
		if err := <-first; !errors.Is(err, failure) {
			h.t.Fatalf("first execution: %v, want its failure", err)
		}
		other := h.params(op.Key, fingerprint("POST /orders, another body"))
		h.mustWin(h.fx.Store, other)
		gate.open()
		if err := <-done; !errors.Is(err, idem.ErrFingerprintMismatch) {
			h.t.Fatalf("waiter whose key went to another request: %v; want idem.ErrFingerprintMismatch", err)
		}
	})

	s.parallel(t, "GetState", func(h *harness) {
		sr, ok := h.fx.Store.(idem.StateReader)
		if !ok {
			h.t.Skip("skipping: the store is no idem.StateReader (the poller reads with Get)")
		}
		state := func(key string) *idem.Record {
			h.t.Helper()
			rec, err := sr.GetState(h.ctx, h.tenant, key)
			if err != nil {
				h.t.Fatalf("GetState(%q): %v", key, err)
			}
			if rec.Result.Body != nil || rec.Result.Header != nil || rec.Result.Status != 0 || rec.Steps != nil {
				h.t.Fatalf("GetState(%q) read the payload: result %+v, %d steps", key, rec.Result, len(rec.Steps))
			}
			return rec
		}
		same := func(what string, got, want *idem.Record) {
			h.t.Helper()
			if got.Tenant != want.Tenant || got.Key != want.Key || got.State != want.State || got.LeaseToken != want.LeaseToken ||
				!bytes.Equal(got.Fingerprint, want.Fingerprint) || !got.LockedUntil.Equal(want.LockedUntil) ||
				!got.CreatedAt.Equal(want.CreatedAt) || !got.CompletedAt.Equal(want.CompletedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
				h.t.Fatalf("%s: GetState = %+v; want what Get reads without result and steps: %+v", what, got, want)
			}
		}
		if _, err := sr.GetState(h.ctx, h.tenant, "absent"); !errors.Is(err, idem.ErrNotFound) {
			h.t.Fatalf("GetState of no record: %v, want idem.ErrNotFound", err)
		}
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(h.fx.Store, p)
		if _, ok := h.fx.Store.(idem.StepStore); ok && !h.caps.NoSteps {
			h.mustSaveStep(h.fx.Store, p.Key, p.Token, "charge", bytes.Repeat([]byte("s"), 4096))
		}
		same("in flight", state(p.Key), h.get(h.fx.Store, p.Key))
		h.mustComplete(h.fx.Store, p.Key, p.Token, idem.Result{Status: 201, Header: map[string][]string{"X": {"y"}}, Body: bytes.Repeat([]byte("b"), 4096)})
		same("complete", state(p.Key), h.get(h.fx.Store, p.Key))
	})
}

// countingTracer counts the engine's claims and reads of records.
type countingTracer struct {
	claims, reads atomic.Int64
	mu            sync.Mutex
	read          chan struct{} // closed, and replaced, at each read
}

func (c *countingTracer) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}

func (c *countingTracer) TraceOperationEnd(context.Context, idem.TraceOperationEndData) {}

func (c *countingTracer) TraceStoreStart(ctx context.Context, _ idem.TraceStoreStartData) context.Context {
	return ctx
}

func (c *countingTracer) TraceStoreEnd(_ context.Context, d idem.TraceStoreEndData) {
	switch d.Operation {
	case idem.StoreClaim:
		c.claims.Add(1)
	case idem.StoreGet:
		c.reads.Add(1)
		c.mu.Lock()
		if c.read != nil {
			close(c.read)
			c.read = nil
		}
		c.mu.Unlock()
	}
}

// waitReads returns once the engine has read records n times.
func (c *countingTracer) waitReads(h *harness, n int64) {
	h.t.Helper()
	for {
		c.mu.Lock()
		if c.reads.Load() >= n {
			c.mu.Unlock()
			return
		}
		if c.read == nil {
			c.read = make(chan struct{})
		}
		read := c.read
		c.mu.Unlock()
		select {
		case <-read:
		case <-h.ctx.Done():
			h.t.Fatalf("the engine read records %d times; waited for %d", c.reads.Load(), n)
		}
	}
}

// gatedStore holds every read of a record (Get, GetState) until open is
// called, and says when the first one came. It forwards Watch and
// GetState to the store when it has them.
type gatedStore struct {
	idem.Store
	entered  chan struct{}
	once     sync.Once
	gate     chan struct{}
	openOnce sync.Once
}

func newGatedStore(s idem.Store) *gatedStore {
	return &gatedStore{Store: s, entered: make(chan struct{}), gate: make(chan struct{})}
}

func (g *gatedStore) hold(ctx context.Context) error {
	g.once.Do(func() { close(g.entered) })
	select {
	case <-g.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gatedStore) open() { g.openOnce.Do(func() { close(g.gate) }) }

// waitRead returns once a read is held.
func (g *gatedStore) waitRead(h *harness) {
	h.t.Helper()
	select {
	case <-g.entered:
	case <-h.ctx.Done():
		h.t.Fatal("the waiter's poller never read the record")
	}
}

func (g *gatedStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	if err := g.hold(ctx); err != nil {
		return nil, err
	}
	return g.Store.Get(ctx, tenant, key)
}

func (g *gatedStore) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	if err := g.hold(ctx); err != nil {
		return nil, err
	}
	if sr, ok := g.Store.(idem.StateReader); ok {
		return sr.GetState(ctx, tenant, key)
	}
	return g.Store.Get(ctx, tenant, key)
}

func (g *gatedStore) Watch(ctx context.Context, tenant, key string) (<-chan struct{}, func(), error) {
	if w, ok := g.Store.(idem.Watcher); ok {
		return w.Watch(ctx, tenant, key)
	}
	return nil, nil, errors.New("idemstoretest: the store is no idem.Watcher")
}
