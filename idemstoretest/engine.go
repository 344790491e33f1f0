package idemstoretest

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// engineRaceGoroutines is how many identical operations Engine.Do gets at
// once.
const engineRaceGoroutines = 50

// engine: idem.Engine.Do over the store, as every front end uses it.
func (s *suite) engine(t *testing.T) {
	s.parallel(t, "RunsOnce", func(h *harness) {
		engines := h.engines(nil)
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /orders")}
		business := newName("order")
		want := idem.Result{Status: 201, Body: []byte(business)}
		var ran atomic.Int32
		fn := func(ctx context.Context) (idem.Result, error) {
			ran.Add(1)
			if h.caps.Transactional {
				if err := h.fx.BusinessWrite(ctx, business); err != nil {
					return idem.Result{}, err
				}
			}
			return want, nil
		}

		outcomes := make([]idem.Outcome, engineRaceGoroutines)
		errs := make([]error, engineRaceGoroutines)
		atOnce(engineRaceGoroutines, func(i int) {
			outcomes[i], errs[i] = engines[i%len(engines)].Do(h.ctx, op, fn)
		})

		fresh, replayed, inFlight := 0, 0, 0
		for i, err := range errs {
			switch {
			case errors.Is(err, idem.ErrInFlight):
				inFlight++
			case err != nil:
				h.t.Errorf("Do %d: %v", i, err)
			case outcomes[i].Replayed:
				replayed++
				checkResult(h.t, "replayed outcome", outcomes[i].Result, want)
			default:
				fresh++
				checkResult(h.t, "fresh outcome", outcomes[i].Result, want)
			}
		}
		if n := ran.Load(); n != 1 || fresh != 1 {
			h.t.Fatalf("%d identical operations at once: fn ran %d times, %d fresh outcomes; want exactly 1", engineRaceGoroutines, n, fresh)
		}
		h.t.Logf("1 run, %d replays, %d in flight", replayed, inFlight)
		if h.caps.Transactional {
			h.mustCount(business, 1, "one operation, one business write")
		}

		out, err := engines[0].Do(h.ctx, op, fn)
		if err != nil || !out.Replayed {
			h.t.Fatalf("Do after completion = %+v, %v; want a replay", out, err)
		}
		checkResult(h.t, "replay", out.Result, want)
		if n := ran.Load(); n != 1 {
			h.t.Errorf("fn ran %d times, want 1", n)
		}
	})

	s.parallel(t, "FingerprintMismatch", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		h.mustDo(e, op, idem.Result{Status: 201})
		op.Fingerprint = fingerprint("b")
		_, err := e.Do(h.ctx, op, func(context.Context) (idem.Result, error) {
			h.t.Error("fn ran for a key used with another request")
			return idem.Result{}, nil
		})
		if !errors.Is(err, idem.ErrFingerprintMismatch) {
			h.t.Errorf("Do with another fingerprint = %v, want idem.ErrFingerprintMismatch", err)
		}
	})

	s.parallel(t, "ErrorReleases", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		business := newName("order")
		boom := errors.New("boom")
		_, err := e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			h.writeFrom(ctx, business)
			return idem.Result{}, boom
		})
		if !errors.Is(err, boom) {
			h.t.Fatalf("Do = %v, want the handler's error", err)
		}
		h.afterFailure(op, business)
	})

	s.parallel(t, "PanicReleases", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		business := newName("order")
		_, err := e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			h.writeFrom(ctx, business)
			panic("boom")
		})
		var pe *idem.PanicError
		if !errors.As(err, &pe) || pe.Value != "boom" {
			h.t.Fatalf("Do of a panicking handler = %v, want *idem.PanicError with value boom", err)
		}
		h.afterAbandon(op, business)
	})

	s.parallel(t, "GoexitReleases", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		business := newName("order")
		done := make(chan struct{})
		returned := false
		go func() {
			defer close(done)
			_, _ = e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
				h.writeFrom(ctx, business)
				runtime.Goexit() // what t.FailNow does, called from a library
				return idem.Result{Status: 201}, nil
			})
			returned = true
		}()
		<-done
		if returned {
			h.t.Fatal("Do returned after its handler's goroutine exited")
		}
		h.afterAbandon(op, business)
	})

	s.parallel(t, "CancelReleases", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		business := newName("order")
		ctx, cancel := context.WithCancel(h.ctx)
		defer cancel()
		answer := idem.Result{Status: 201, Body: []byte("made while the caller left")}
		_, err := e.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			h.writeFrom(ctx, business)
			// The client went away: the caller's context ends while the
			// handler runs, and the handler does not notice.
			cancel()
			return answer, nil
		})
		if !errors.Is(err, context.Canceled) {
			h.t.Fatalf("Do whose context ended during fn = %v, want context.Canceled", err)
		}
		if h.caps.Transactional {
			h.afterFailure(op, business)
			return
		}
		// Nothing could be undone: the answer is stored for the retry,
		// which must not run fn again.
		h.mustBeComplete(h.fx.Store, op.Key, answer)
		out, err := e.Do(h.ctx, op, func(context.Context) (idem.Result, error) {
			h.t.Error("fn ran again after a cancelled execution on a store without transactions")
			return idem.Result{}, nil
		})
		if err != nil || !out.Replayed {
			h.t.Fatalf("retry = %+v, %v; want a replay", out, err)
		}
	})

	s.parallel(t, "NotExecutedReleases", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		answer := idem.Result{Status: 415, Body: []byte("send JSON")}
		out, err := e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			if !idem.NotExecuted(ctx) {
				h.t.Error("NotExecuted found no execution in fn's context")
			}
			return answer, nil
		})
		if err != nil || !out.NotStored || out.Replayed {
			h.t.Fatalf("Do of a not-executed answer = %+v, %v; want NotStored", out, err)
		}
		checkResult(h.t, "not-executed outcome", out.Result, answer)
		h.afterFailure(op, "")
	})

	s.parallel(t, "RollbackWritesStored", func(h *harness) {
		e := h.engines(nil)[0]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		business := newName("order")
		want := idem.Result{Status: 503, Body: []byte("try later")}
		out, err := e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			h.writeFrom(ctx, business)
			if !idem.RollbackWrites(ctx) {
				h.t.Error("RollbackWrites found no execution in fn's context")
			}
			return want, nil
		})
		if err != nil || out.Replayed {
			h.t.Fatalf("Do = %+v, %v; want a fresh outcome", out, err)
		}
		checkResult(h.t, "fresh outcome", out.Result, want)
		if h.caps.Transactional {
			h.mustCount(business, 0, "RollbackWrites rolls the business write back")
		} else {
			h.t.Log("not Transactional: only the stored result is checked")
		}
		h.mustBeComplete(h.fx.Store, "order-1", want)

		out, err = e.Do(h.ctx, op, func(context.Context) (idem.Result, error) {
			h.t.Error("fn ran again after a stored RollbackWrites result")
			return idem.Result{}, nil
		})
		if err != nil || !out.Replayed {
			h.t.Fatalf("retry = %+v, %v; want a replay", out, err)
		}
		checkResult(h.t, "replay", out.Result, want)
		if h.caps.Transactional {
			h.mustCount(business, 0, "a replay writes nothing")
		}
	})

	s.parallel(t, "HeartbeatKeepsKey", func(h *harness) {
		h.requireConcurrentWriters()
		const lease = 2 * shortLease
		engines := h.engines(&idem.Config{Lease: lease, Heartbeat: lease / 6})
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		business := newName("order")
		want := idem.Result{Status: 201, Body: []byte("slow")}

		started := make(chan time.Time, 1)
		retried := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(retried) }) }
		defer release()
		slowErr := make(chan error, 1)
		go func() {
			_, err := engines[0].Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
				h.writeFrom(ctx, business)
				started <- time.Now()
				select {
				case <-retried:
				case <-ctx.Done():
					return idem.Result{}, context.Cause(ctx)
				}
				return want, nil
			})
			slowErr <- err
		}()
		select {
		case at := <-started:
			sleepPast(h.t, at, lease)
		case err := <-slowErr:
			h.t.Fatalf("the slow Do ended before its handler ran: %v", err)
		}

		// Past the first lease, only the heartbeat holds the key.
		const retries = 5
		var ran atomic.Int32
		errs := make([]error, retries)
		atOnce(retries, func(i int) {
			_, errs[i] = engines[i%len(engines)].Do(h.ctx, op, func(context.Context) (idem.Result, error) {
				ran.Add(1)
				return idem.Result{Status: 201, Body: []byte("retry")}, nil
			})
		})
		release()
		for i, err := range errs {
			if !errors.Is(err, idem.ErrInFlight) {
				h.t.Errorf("retry %d under a live heartbeat = %v, want idem.ErrInFlight", i, err)
			}
		}
		if n := ran.Load(); n != 0 {
			h.t.Errorf("retries ran %d times while the slow handler held the key", n)
		}
		if err := <-slowErr; err != nil {
			h.t.Fatalf("slow Do = %v, want its completion", err)
		}
		h.mustBeComplete(h.fx.Store, "order-1", want)
		if h.caps.Transactional {
			h.mustCount(business, 1, "the slow handler's write commits")
		}
	})

	s.parallel(t, "TakeoverLeaseLost", func(h *harness) {
		h.requireConcurrentWriters()
		if h.caps.SingleTransaction {
			h.t.Skip("skipping: in the single-transaction mode the database's lock is the lease, and it does not end under a live handler")
		}
		cfg := &idem.Config{Lease: shortLease, Heartbeat: -1}
		engines := h.engines(cfg)
		slow, taker := engines[0], engines[len(engines)-1]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("a")}
		slowWrite, takerWrite := newName("order"), newName("order")

		started := make(chan time.Time, 1)
		taken := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(taken) }) }
		defer release()
		slowErr := make(chan error, 1)
		go func() {
			_, err := slow.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
				h.writeFrom(ctx, slowWrite)
				started <- time.Now()
				<-taken // stalls past its lease, with no heartbeat
				return idem.Result{Status: 201, Body: []byte("slow")}, nil
			})
			slowErr <- err
		}()
		select {
		case at := <-started:
			sleepPast(h.t, at, shortLease)
		case err := <-slowErr:
			h.t.Fatalf("the slow Do ended before its handler ran: %v", err)
		}

		want := idem.Result{Status: 201, Body: []byte("taker")}
		out, err := taker.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
			h.writeFrom(ctx, takerWrite)
			return want, nil
		})
		release()
		if err != nil || out.Replayed {
			h.t.Fatalf("Do after the lease ended = %+v, %v; want a takeover that runs", out, err)
		}
		if err := <-slowErr; !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Do of the execution taken over = %v, want idem.ErrLeaseLost", err)
		}
		if h.caps.Transactional {
			h.mustCount(slowWrite, 0, "the execution taken over must leave no business write")
			h.mustCount(takerWrite, 1, "the taker's business write commits")
		}
		h.mustBeComplete(h.fx.Store, "order-1", want)
	})
}

// engines returns an engine over Store and, when there is one, one over
// Peer.
func (h *harness) engines(cfg *idem.Config) []*idem.Engine {
	h.t.Helper()
	c := idem.Config{}
	if cfg != nil {
		c = *cfg
	}
	if c.Logger == nil {
		// The cases provoke the warnings on purpose.
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	var out []*idem.Engine
	for _, st := range h.stores() {
		e, err := idem.NewEngine(st, &c)
		if err != nil {
			h.t.Fatalf("NewEngine: %v", err)
		}
		h.t.Cleanup(func() { _ = e.Close(context.Background()) })
		out = append(out, e)
	}
	return out
}

// mustDo runs op to completion with a handler returning res.
func (h *harness) mustDo(e *idem.Engine, op idem.Operation, res idem.Result) {
	h.t.Helper()
	out, err := e.Do(h.ctx, op, func(context.Context) (idem.Result, error) { return res, nil })
	if err != nil || out.Replayed {
		h.t.Fatalf("Do(%q) = %+v, %v; want a fresh outcome", op.Key, out, err)
	}
}

// writeFrom makes the business write id from inside a handler, for
// Transactional stores. It may run off the test goroutine, so it reports
// with Error, not Fatal.
func (h *harness) writeFrom(ctx context.Context, id string) {
	if !h.caps.Transactional {
		return
	}
	if err := h.fx.BusinessWrite(ctx, id); err != nil {
		h.t.Errorf("BusinessWrite(%q) from the handler: %v", id, err)
	}
}

// afterFailure checks what a failed execution of op leaves: no business
// write, no record, and a retry that runs.
func (h *harness) afterFailure(op idem.Operation, business string) {
	h.t.Helper()
	if h.caps.Transactional && business != "" {
		h.mustCount(business, 0, "a failed execution must leave no business write")
	}
	h.mustBeAbsent(h.fx.Store, op.Key)
	e := h.engines(nil)[len(h.stores())-1]
	want := idem.Result{Status: 201, Body: []byte("second try")}
	h.mustDo(e, op, want)
	h.mustBeComplete(h.fx.Store, op.Key, want)
}

// afterAbandon checks a key whose handler panicked or ended its goroutine:
// rolled back and released on a transactional store; held on another,
// where the handler's effects may stand, until its lease ends, unextended.
func (h *harness) afterAbandon(op idem.Operation, business string) {
	h.t.Helper()
	if h.caps.Transactional {
		h.afterFailure(op, business)
		return
	}
	rec, err := h.fx.Store.Get(h.ctx, op.Tenant, op.Key)
	if err != nil || rec.State != idem.StateInFlight {
		h.t.Fatalf("after an abandoned execution on a store without transactions: record %+v, %v; want it in flight until its lease ends", rec, err)
	}
}
