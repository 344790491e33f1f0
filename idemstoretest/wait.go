package idemstoretest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// The wait mode's numbers: duplicates released together against a handler
// slow enough that they all meet it in flight, and a wait long enough for
// it to end, with room for a loaded machine.
const (
	waitDuplicates = 20
	waitHandler    = 500 * time.Millisecond
	waitLimit      = 2 * time.Second
	// watchPatience bounds the wait for a Watcher's channel to close after
	// the change that must close it; it only ever runs out on a failure.
	watchPatience = 10 * time.Second
)

// wait: duplicates that wait for the execution in flight
// (idem.Operation.WaitInFlight), and the store's idem.Watcher when it has
// one. Every store passes the engine's cases, since the engine polls the
// stores that do not watch.
func (s *suite) wait(t *testing.T) {
	s.parallel(t, "DuplicatesReplay", func(h *harness) {
		engines := h.engines(nil)
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders"), WaitInFlight: waitLimit}
		business := newName("order")
		want := idem.Result{Status: 201, Body: []byte(business)}
		var ran atomic.Int32
		fn := func(ctx context.Context) (idem.Result, error) {
			ran.Add(1)
			if err := sleepCtx(ctx, waitHandler); err != nil {
				return idem.Result{}, err
			}
			if h.caps.Transactional {
				if err := h.fx.BusinessWrite(ctx, business); err != nil {
					return idem.Result{}, err
				}
			}
			return want, nil
		}
		outcomes, errs := h.duplicates(engines, op, fn)
		fresh, replayed := 0, 0
		for i, err := range errs {
			switch {
			case err != nil:
				h.t.Errorf("duplicate %d: %v; want its answer (WaitInFlight %s, handler %s)", i, err, waitLimit, waitHandler)
			case outcomes[i].Replayed:
				replayed++
				checkResult(h.t, "replayed outcome", outcomes[i].Result, want)
			default:
				fresh++
				checkResult(h.t, "fresh outcome", outcomes[i].Result, want)
			}
		}
		if n := ran.Load(); n != 1 || fresh != 1 || replayed != waitDuplicates-1 {
			h.t.Fatalf("%d duplicates waiting: fn ran %d times, %d fresh, %d replayed; want 1 run, 1 fresh, %d replayed",
				waitDuplicates, n, fresh, replayed, waitDuplicates-1)
		}
		if h.caps.Transactional {
			h.mustCount(business, 1, "one operation, one business write")
		}
	})

	s.parallel(t, "FirstFails", func(h *harness) {
		// The first execution fails and releases the key: the waiters get
		// what a retry gets, one of them runs, the others wait for it.
		engines := h.engines(nil)
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders"), WaitInFlight: waitLimit}
		want := idem.Result{Status: 201, Body: []byte("second")}
		failure := errors.New("the first execution fails")
		var ran atomic.Int32
		fn := func(ctx context.Context) (idem.Result, error) {
			n := ran.Add(1)
			if err := sleepCtx(ctx, waitHandler/2); err != nil {
				return idem.Result{}, err
			}
			if n == 1 {
				return idem.Result{}, failure
			}
			return want, nil
		}
		outcomes, errs := h.duplicates(engines, op, fn)
		failed, fresh, replayed := 0, 0, 0
		for i, err := range errs {
			switch {
			case errors.Is(err, failure):
				failed++
			case err != nil:
				h.t.Errorf("duplicate %d: %v; want the answer of the second execution", i, err)
			case outcomes[i].Replayed:
				replayed++
				checkResult(h.t, "replayed outcome", outcomes[i].Result, want)
			default:
				fresh++
				checkResult(h.t, "fresh outcome", outcomes[i].Result, want)
			}
		}
		if n := ran.Load(); n != 2 || failed != 1 || fresh != 1 || replayed != waitDuplicates-2 {
			h.t.Fatalf("first execution failed: fn ran %d times, %d failed, %d fresh, %d replayed; want 2 runs, 1 failed, 1 fresh, %d replayed",
				n, failed, fresh, replayed, waitDuplicates-2)
		}
	})

	s.parallel(t, "Deadline", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders")}
		running, release := h.holdInFlight(e, op)
		defer release()
		<-running
		op.WaitInFlight = 50 * time.Millisecond
		if out, err := e.Do(h.ctx, op, h.mustNotRun); !errors.Is(err, idem.ErrInFlight) {
			h.t.Fatalf("Do with WaitInFlight %s on a key held for the whole case = %+v, %v; want idem.ErrInFlight", op.WaitInFlight, out, err)
		}
	})

	s.parallel(t, "WaiterCancelled", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders")}
		running, release := h.holdInFlight(e, op)
		defer release()
		<-running
		op.WaitInFlight = 10 * time.Minute
		for _, how := range []string{"ctx", "WaitContext"} {
			ctx, cancel := context.WithCancel(h.ctx)
			o := op
			if how == "WaitContext" {
				o.WaitContext, ctx = ctx, h.ctx
			}
			done := make(chan error, 1)
			go func() {
				_, err := e.Do(ctx, o, h.mustNotRun)
				done <- err
			}()
			// Cancelled before or while it waits: either way it must return
			// while the execution it waits for still runs.
			time.Sleep(20 * time.Millisecond)
			cancel()
			select {
			case err := <-done:
				// A cancellation that came before the claim fails the claim
				// instead (a store error): no wait either.
				if !errors.Is(err, context.Canceled) && (how != "ctx" || !errors.Is(err, idem.ErrStore)) {
					h.t.Errorf("waiter whose %s was cancelled returned %v, want context.Canceled", how, err)
				}
			case <-time.After(watchPatience):
				h.t.Fatalf("waiter whose %s was cancelled still waits for the execution in flight", how)
			}
		}
	})

	s.parallel(t, "WatchComplete", func(h *harness) {
		w := h.requireWatcher()
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(h.fx.Store, p)
		changed, stop := h.watch(w, p.Key)
		defer stop()
		h.notClosed(changed, "Watch of a record in flight")
		h.mustComplete(h.fx.Store, p.Key, p.Token, idem.Result{Status: 201})
		h.closes(changed, "Watch after the record completed")
	})

	s.parallel(t, "WatchRelease", func(h *harness) {
		w := h.requireWatcher()
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(h.fx.Store, p)
		changed, stop := h.watch(w, p.Key)
		defer stop()
		if err := h.fx.Store.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: p.Key, Token: p.Token}); err != nil {
			h.t.Fatalf("Release: %v", err)
		}
		h.closes(changed, "Watch after the record was released")
	})

	s.parallel(t, "WatchStop", func(h *harness) {
		// Two subscribers; the first stops: the second is still told.
		w := h.requireWatcher()
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(h.fx.Store, p)
		first, stopFirst := h.watch(w, p.Key)
		second, stopSecond := h.watch(w, p.Key)
		defer stopSecond()
		stopFirst()
		h.notClosed(first, "Watch of a record in flight, after stop")
		h.mustComplete(h.fx.Store, p.Key, p.Token, idem.Result{Status: 201})
		h.closes(second, "Watch after the record completed, another subscriber having stopped")
	})
	s.waitCounted(t)
}

// duplicates runs op on waitDuplicates goroutines released by one
// barrier, spread over engines.
func (h *harness) duplicates(engines []*idem.Engine, op idem.Operation, fn func(context.Context) (idem.Result, error)) ([]idem.Outcome, []error) {
	outcomes := make([]idem.Outcome, waitDuplicates)
	errs := make([]error, waitDuplicates)
	atOnce(waitDuplicates, func(i int) {
		outcomes[i], errs[i] = engines[i%len(engines)].Do(h.ctx, op, fn)
	})
	return outcomes, errs
}

// holdInFlight starts op on e with a handler that runs until release is
// called; running is closed once it runs.
func (h *harness) holdInFlight(e *idem.Engine, op idem.Operation) (running <-chan struct{}, release func()) {
	started := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			select {
			case <-stop:
			case <-ctx.Done():
			}
			return idem.Result{Status: 201}, nil
		})
	}()
	return started, func() {
		close(stop)
		<-done
	}
}

// mustNotRun is the function of a duplicate that must not run.
func (h *harness) mustNotRun(context.Context) (idem.Result, error) {
	h.t.Error("the function of a duplicate ran while the first execution was in flight")
	return idem.Result{}, errors.New("must not run")
}

// requireWatcher returns the store as an idem.Watcher, or skips the case.
func (h *harness) requireWatcher() idem.Watcher {
	h.t.Helper()
	w, ok := h.fx.Store.(idem.Watcher)
	if !ok {
		h.t.Skip("skipping: the store is no idem.Watcher (the engine polls it)")
	}
	return w
}

func (h *harness) watch(w idem.Watcher, key string) (<-chan struct{}, func()) {
	h.t.Helper()
	changed, stop, err := w.Watch(h.ctx, h.tenant, key)
	if err != nil {
		h.t.Fatalf("Watch(%q, %q): %v", h.tenant, key, err)
	}
	return changed, stop
}

// closes fails the case unless changed is closed within watchPatience.
func (h *harness) closes(changed <-chan struct{}, what string) {
	h.t.Helper()
	select {
	case <-changed:
	case <-time.After(watchPatience):
		h.t.Fatalf("%s: the channel is still open after %s", what, watchPatience)
	}
}

// notClosed fails the case when changed is closed already.
func (h *harness) notClosed(changed <-chan struct{}, what string) {
	h.t.Helper()
	select {
	case <-changed:
		h.t.Fatalf("%s: the channel is closed, and nothing changed", what)
	default:
	}
}

// sleepCtx sleeps for d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
