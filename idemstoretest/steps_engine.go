package idemstoretest

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemcodec"
)

// stepsThroughEngine: what idem.Step does over the store once the lease is
// lost, and the step budget. The cases run through the engine, since the
// engine decides, but each store must give it what it needs: an
// extension refused after a release, a step's record refused after a
// takeover, steps read back whole.
func (s *suite) stepsThroughEngine(t *testing.T) {
	// Once the heartbeat has found the lease lost, and cancelled the
	// handler's context, a step does not run: the key may be another
	// execution's by now, which ran the step itself.
	s.parallel(t, "EngineStepAfterHeartbeatLost", func(h *harness) {
		if h.caps.SingleTransaction {
			// Steps are refused in that mode, and a second engine's claim
			// would wait on the first one's transaction for ever here.
			h.stepRefused()
			return
		}
		engines := h.engines(&idem.Config{Lease: 10 * time.Second, Heartbeat: 100 * time.Millisecond})
		slow, taker := engines[0], engines[len(engines)-1]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /payments")}
		token := make(chan int64, 1)
		taken := make(chan struct{})
		var ran atomic.Int32
		stepErr := make(chan error, 1)
		slowErr := make(chan error, 1)
		go func() {
			_, err := slow.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
				x, _ := idem.ExecutionFromContext(ctx)
				token <- x.LeaseToken
				<-taken
				select {
				case <-ctx.Done(): // the heartbeat found the lease lost
				case <-time.After(caseTimeout / 2):
					stepErr <- errors.New("the heartbeat never found the lease lost")
					return idem.Result{}, nil
				}
				_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
					ran.Add(1)
					return "ch_late", nil
				})
				stepErr <- err
				return idem.Result{Status: 201}, err
			})
			slowErr <- err
		}()
		// An operator releases the key from under the running execution
		// (by its lease token), and another execution runs and completes.
		h.release(h.fx.Store, op.Key, <-token)
		want := idem.Result{Status: 201, Body: []byte("taker")}
		h.mustDo(taker, op, want)
		close(taken)
		if err := <-stepErr; !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrStepNotSaved) {
			h.t.Errorf("Step once the heartbeat found the lease lost = %v, want idem.ErrLeaseLost, and not ErrStepNotSaved (nothing ran)", err)
		}
		if n := ran.Load(); n != 0 {
			h.t.Errorf("the step's function ran %d times after the lease was known lost: the card is charged twice", n)
		}
		if err := <-slowErr; !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Do of the execution that lost its lease = %v, want idem.ErrLeaseLost", err)
		}
		rec := h.mustBeComplete(h.fx.Store, op.Key, want)
		if len(rec.Steps) != 0 {
			h.t.Errorf("the record holds steps %s, want none", showSteps(rec.Steps))
		}
	})

	// With the heartbeat off, the engine learns of the takeover when the
	// store refuses the step's record: the execution ends as a lost lease
	// (traced), is not said to keep a key the takeover completed, and no
	// later step of it runs.
	s.parallel(t, "EngineStepRefusedAfterTakeover", func(h *harness) {
		if h.caps.SingleTransaction {
			// Steps are refused in that mode, and a second engine's claim
			// would wait on the first one's transaction for ever here.
			h.stepRefused()
			return
		}
		leases := &leaseEvents{}
		var logs lockedBuffer
		engines := h.engines(&idem.Config{Lease: shortLease, Heartbeat: -1, Tracer: leases, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		slow, taker := engines[0], engines[len(engines)-1]
		op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /payments")}
		started := make(chan time.Time, 1)
		taken := make(chan struct{})
		var later atomic.Int32
		var first, second error
		slowErr := make(chan error, 1)
		go func() {
			_, err := slow.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
				started <- time.Now()
				<-taken // stalls past its lease, with no heartbeat
				_, first = idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_late", nil })
				_, second = idem.Step(ctx, "email", func(context.Context) (string, error) {
					later.Add(1)
					return "sent", nil
				})
				return idem.Result{Status: 201}, nil // ignores the errors
			})
			slowErr <- err
		}()
		sleepPast(h.t, <-started, shortLease)
		want := idem.Result{Status: 201, Body: []byte("taker")}
		h.mustDo(taker, op, want)
		leases.take()
		close(taken)
		err := <-slowErr
		if !errors.Is(first, idem.ErrStepNotSaved) || !errors.Is(first, idem.ErrLeaseLost) {
			h.t.Errorf("Step after the takeover = %v, want idem.ErrStepNotSaved and idem.ErrLeaseLost", first)
		}
		if !errors.Is(second, idem.ErrLeaseLost) || later.Load() != 0 {
			h.t.Errorf("Step after the store refused one = %v (ran %d times), want idem.ErrLeaseLost without running", second, later.Load())
		}
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Do of the execution taken over = %v, want idem.ErrLeaseLost", err)
		}
		if got := leases.take(); got[idem.LeaseLost] != 1 {
			h.t.Errorf("lease events of the execution taken over %v, want one LeaseLost", got)
		}
		if strings.Contains(logs.String(), "stays in flight") {
			h.t.Errorf("the engine says the key stays in flight, though the takeover completed it:\n%s", logs.String())
		}
		h.mustBeComplete(h.fx.Store, op.Key, want)
	})

	// The step budget: a result over MaxStepBytes, or steps over
	// MaxStepsBytes, are refused with a clear error, and the record never
	// holds more; a record whose steps fill the budget refuses the next
	// step before its function runs, in a takeover too.
	s.parallel(t, "EngineStepBudget", func(h *harness) {
		if h.caps.SingleTransaction {
			// Steps are refused in that mode, and a second engine's claim
			// would wait on the first one's transaction for ever here.
			h.stepRefused()
			return
		}
		value := strings.Repeat("x", 98) // 100 bytes of JSON
		// Each step "sN" encodes as 1+2+1+100 bytes.
		const perStep = 104
		engines := h.engines(&idem.Config{MaxStepBytes: 150, MaxStepsBytes: 2 * perStep})
		var runs atomic.Int32
		step := func(ctx context.Context, name, v string) error {
			_, err := idem.Step(ctx, name, func(context.Context) (string, error) {
				runs.Add(1)
				return v, nil
			})
			return err
		}

		big := idem.Operation{Tenant: h.tenant, Key: "big", Fingerprint: fingerprint("a")}
		var bigErr error
		_, err := engines[0].Do(h.ctx, big, func(ctx context.Context) (idem.Result, error) {
			bigErr = step(ctx, "s1", strings.Repeat("x", 200))
			return idem.Result{}, bigErr
		})
		if !errors.Is(bigErr, idem.ErrStepTooLarge) || !errors.Is(bigErr, idem.ErrStepNotSaved) {
			h.t.Errorf("a step over MaxStepBytes = %v, want idem.ErrStepTooLarge and idem.ErrStepNotSaved (it ran)", bigErr)
		}
		if !errors.Is(err, idem.ErrStepNotSaved) {
			h.t.Errorf("Do after a step over MaxStepBytes = %v, want idem.ErrStepNotSaved", err)
		}
		if rec := h.get(h.fx.Store, big.Key); len(rec.Steps) != 0 {
			h.t.Errorf("the record holds %s after a step over MaxStepBytes, want nothing", showSteps(rec.Steps))
		}

		full := idem.Operation{Tenant: h.tenant, Key: "full", Fingerprint: fingerprint("a")}
		failure := errors.New("failed after two steps")
		var third error
		_, err = engines[0].Do(h.ctx, full, func(ctx context.Context) (idem.Result, error) {
			for _, name := range []string{"s1", "s2"} {
				if err := step(ctx, name, value); err != nil {
					return idem.Result{}, err
				}
			}
			third = step(ctx, "s3", "y")
			return idem.Result{}, failure
		})
		if !errors.Is(err, failure) {
			h.t.Fatalf("Do recording two steps = %v, want the handler's error", err)
		}
		if !errors.Is(third, idem.ErrStepTooLarge) || errors.Is(third, idem.ErrStepNotSaved) {
			h.t.Errorf("a step past a full MaxStepsBytes = %v, want idem.ErrStepTooLarge, refused before it ran", third)
		}
		runsBefore := runs.Load()
		// The takeover gets the two steps, and its new step is refused
		// before it runs: the budget counts the record's steps, not the
		// execution's.
		var again error
		_, err = engines[len(engines)-1].Do(h.ctx, full, func(ctx context.Context) (idem.Result, error) {
			if err := step(ctx, "s1", "changed"); err != nil {
				return idem.Result{}, err
			}
			again = step(ctx, "s4", "z")
			return idem.Result{}, failure
		})
		if !errors.Is(err, failure) {
			h.t.Fatalf("takeover = %v, want the handler's error", err)
		}
		if !errors.Is(again, idem.ErrStepTooLarge) || errors.Is(again, idem.ErrStepNotSaved) {
			h.t.Errorf("a takeover's step past the record's full budget = %v, want idem.ErrStepTooLarge before it ran", again)
		}
		if n := runs.Load() - runsBefore; n != 0 {
			h.t.Errorf("the takeover ran %d step functions, want none (s1 recorded, s4 refused)", n)
		}
		rec := h.get(h.fx.Store, full.Key)
		if len(rec.Steps) != 2 || len(idemcodec.MarshalSteps(rec.Steps)) > 2*perStep || !bytes.Contains(rec.Steps[0].Value, []byte(value)) {
			h.t.Errorf("the record holds %s, want s1 and s2 within the budget", showSteps(rec.Steps))
		}
	})
}

// leaseEvents is a tracer that counts lease events.
type leaseEvents struct {
	mu     sync.Mutex
	events map[idem.LeaseEvent]int
}

func (l *leaseEvents) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}

func (l *leaseEvents) TraceOperationEnd(context.Context, idem.TraceOperationEndData) {}

func (l *leaseEvents) TraceLease(_ context.Context, d idem.TraceLeaseData) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.events == nil {
		l.events = map[idem.LeaseEvent]int{}
	}
	l.events[d.Event]++
}

// take returns the events counted so far, and starts counting afresh.
func (l *leaseEvents) take() map[idem.LeaseEvent]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.events
	l.events = nil
	return out
}

// lockedBuffer is a log destination safe for concurrent writers.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
