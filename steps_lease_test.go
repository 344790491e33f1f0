package idem_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// keepInFlightLog is what the engine logs when it leaves a key held until
// its lease ends.
const keepInFlightLog = "the key stays in flight until its lease ends"

// TestStepRefusedOnceHeartbeatLostLease: once the heartbeat has found the
// lease taken over (and cancelled the handler's context), a Step does not
// run its function: the takeover may have run it already.
func TestStepRefusedOnceHeartbeatLostLease(t *testing.T) {
	store, skew := skewedStore()
	rec := &recorder{}
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: 20 * time.Millisecond, Tracer: rec, Logger: slog.New(slog.DiscardHandler)})
	defer e.Close(context.Background())
	op := idem.Operation{Key: "pay-1", Fingerprint: []byte("a")}

	started := make(chan struct{})
	taken := make(chan struct{})
	var ran atomic.Int32
	stepErr := make(chan error, 1)
	doErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			<-taken
			<-ctx.Done() // the heartbeat finds the lease lost
			_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
				ran.Add(1)
				return "ch_late", nil
			})
			stepErr <- err
			return idem.Result{Status: 201}, err
		})
		doErr <- err
	}()
	<-started
	skew.Store(int64(2 * time.Minute))
	if _, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 202}, nil
	}); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	close(taken)
	if err := <-stepErr; !errors.Is(err, idem.ErrLeaseLost) || errors.Is(err, idem.ErrStepNotSaved) {
		t.Errorf("Step after the heartbeat found the lease lost = %v, want ErrLeaseLost, without ErrStepNotSaved (nothing ran)", err)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("the step's function ran %d times after the lease was known lost, want 0", n)
	}
	if err := <-doErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Do = %v, want ErrLeaseLost", err)
	}
	got, err := store.Get(context.Background(), op.Tenant, op.Key)
	if err != nil || got.State != idem.StateComplete || got.Result.Status != 202 || len(got.Steps) != 0 {
		t.Errorf("record = %+v, %v; want the taker's completion, no step", got, err)
	}
}

// TestStepRefusedByStoreIsLeaseLost: with the heartbeat off, the engine
// learns of a takeover only when the store refuses the step's record. The
// execution then ends as a lost lease (counted, traced, logged as such),
// not as a key kept in flight (the takeover completed it), and no later
// step of it runs its function.
func TestStepRefusedByStoreIsLeaseLost(t *testing.T) {
	store, skew := skewedStore()
	rec := &recorder{}
	var logs logBuffer
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: -1, Tracer: rec, Logger: logs.logger()})
	op := idem.Operation{Key: "pay-1", Fingerprint: []byte("a")}

	started := make(chan struct{})
	taken := make(chan struct{})
	var second atomic.Int32
	type stepResult struct {
		first, second error
	}
	stepped := make(chan stepResult, 1)
	doErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			<-taken
			var r stepResult
			_, r.first = idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_late", nil })
			_, r.second = idem.Step(ctx, "email", func(context.Context) (string, error) {
				second.Add(1)
				return "sent", nil
			})
			stepped <- r
			return idem.Result{Status: 201}, nil // a handler that ignores the errors
		})
		doErr <- err
	}()
	<-started
	skew.Store(int64(2 * time.Minute))
	if _, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 202}, nil
	}); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	rec.take()
	close(taken)
	r := <-stepped
	if !errors.Is(r.first, idem.ErrStepNotSaved) || !errors.Is(r.first, idem.ErrLeaseLost) {
		t.Errorf("first Step = %v, want ErrStepNotSaved and ErrLeaseLost", r.first)
	}
	if !errors.Is(r.second, idem.ErrLeaseLost) || second.Load() != 0 {
		t.Errorf("Step after the store refused one = %v, ran %d times; want ErrLeaseLost, not run", r.second, second.Load())
	}
	err := <-doErr
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Do = %v, want ErrLeaseLost", err)
	}
	events := rec.take()
	if !slices.Contains(events, "lease lost") || !slices.Contains(events, "end lease_lost") {
		t.Errorf("traced %q, want a lost lease and the outcome lease_lost", events)
	}
	if strings.Contains(logs.String(), keepInFlightLog) {
		t.Errorf("the engine says the key stays in flight, though the takeover completed it:\n%s", logs.String())
	}
	got, gerr := store.Get(context.Background(), op.Tenant, op.Key)
	if gerr != nil || got.State != idem.StateComplete || got.Result.Status != 202 {
		t.Errorf("record = %+v, %v; want the taker's completion", got, gerr)
	}
}

// TestDownstreamKeyBoundToRequest: after an execution that stored nothing
// (NotExecuted on a step whose outcome is unknown), another request under
// the same key gets another downstream key, so that a service answering
// by key alone cannot hand it the first request's result; the same
// request gets the same one back.
func TestDownstreamKeyBoundToRequest(t *testing.T) {
	e := newEngine(t, idemmem.NewStore(nil), &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	keyOf := func(fingerprint string, notExecuted bool) string {
		t.Helper()
		var dk string
		op := idem.Operation{Tenant: "acme", Key: "pay-1", Fingerprint: []byte(fingerprint)}
		out, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			dk = idem.DownstreamKey(ctx, "charge")
			if notExecuted {
				// The card call timed out: its outcome is unknown, and
				// nothing was recorded.
				_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
					return "", context.DeadlineExceeded
				})
				if err == nil {
					t.Error("the failing step returned no error")
				}
				idem.NotExecuted(ctx)
				return idem.Result{Status: 502}, nil
			}
			return idem.Result{Status: 201}, nil
		})
		if err != nil || out.NotStored != notExecuted {
			t.Fatalf("Do(%s) = %+v, %v", fingerprint, out, err)
		}
		return dk
	}
	first := keyOf("POST /payments amount=1", true)
	other := keyOf("POST /payments amount=100000", true)
	same := keyOf("POST /payments amount=1", false)
	if first == other {
		t.Errorf("two requests under one key share the downstream key %q", first)
	}
	if first != same {
		t.Errorf("the same request got downstream keys %q then %q", first, same)
	}
}

// flakySteps is a memory store whose SaveStep fails the first times, as a
// store that comes back after an outage does.
type flakySteps struct {
	*idemmem.Store
	failures atomic.Int32
}

func (f *flakySteps) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	if f.failures.Add(-1) >= 0 {
		return errors.New("connection refused")
	}
	return f.Store.SaveStep(ctx, p)
}

// TestStepRecordedAfterHandler: a step that ran and whose record failed is
// recorded later, while the engine keeps the lease: the retries are told
// the key is in flight meanwhile, and the one that takes the key over
// gets the step's result instead of running it again. Without the late
// record, the takeover after the lease would charge the card again.
func TestStepRecordedAfterHandler(t *testing.T) {
	store := &flakySteps{Store: idemmem.NewStore(nil)}
	store.failures.Store(3)
	var logs logBuffer
	e := newEngine(t, store, &idem.Config{Lease: 2 * time.Second, Heartbeat: 200 * time.Millisecond, Logger: logs.logger()})
	defer e.Close(context.Background())
	op := idem.Operation{Tenant: "acme", Key: "pay-1", Fingerprint: []byte("a")}
	var charges atomic.Int32
	pay := func(ctx context.Context) (idem.Result, error) {
		id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			return "ch_" + strconv.Itoa(int(charges.Add(1))), nil
		})
		return idem.Result{Status: 201, Body: []byte(id)}, err
	}
	if _, err := e.Do(context.Background(), op, pay); !errors.Is(err, idem.ErrStepNotSaved) {
		t.Fatalf("Do = %v, want ErrStepNotSaved", err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, err := e.Do(context.Background(), op, pay)
		if errors.Is(err, idem.ErrInFlight) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil || string(out.Result.Body) != "ch_1" {
			t.Fatalf("retry = %+v, %v; want the recorded ch_1", out, err)
		}
		break
	}
	if n := charges.Load(); n != 1 {
		t.Fatalf("%d charges, want 1", n)
	}
	if !strings.Contains(logs.String(), "recorded after the handler returned") {
		t.Errorf("no log of the late record:\n%s", logs.String())
	}
}

// scriptedSteps is a memory store whose SaveStep fails as its script says,
// by step name.
type scriptedSteps struct {
	*idemmem.Store
	errs map[string]error
}

func (s scriptedSteps) SaveStep(ctx context.Context, p idem.SaveStepParams) error {
	if err := s.errs[p.Name]; err != nil {
		return err
	}
	return s.Store.SaveStep(ctx, p)
}

// TestStepLeaseLostAfterUnsaved: a step whose record failed, then one the
// store refused for a lost lease: the execution ends as a lost lease, not
// as a key said to stay in flight.
func TestStepLeaseLostAfterUnsaved(t *testing.T) {
	store := scriptedSteps{idemmem.NewStore(nil), map[string]error{
		"a": errors.New("connection reset"),
		"b": idem.ErrLeaseLost,
	}}
	var logs logBuffer
	e := newEngine(t, store, &idem.Config{Heartbeat: -1, Logger: logs.logger()})
	_, err := e.Do(context.Background(), idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		for _, name := range []string{"a", "b"} {
			_, _ = idem.Step(ctx, name, func(context.Context) (int, error) { return 1, nil })
		}
		return idem.Result{Status: 201}, nil
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Do = %v, want ErrLeaseLost", err)
	}
	if strings.Contains(logs.String(), keepInFlightLog) {
		t.Errorf("the engine says the key stays in flight after losing its lease:\n%s", logs.String())
	}
}
