package idem_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// skewedStore is an idemmem store whose clock the test moves forward, so
// that a lease ends without waiting for it.
func skewedStore() (*idemmem.Store, *atomic.Int64) {
	var skew atomic.Int64
	store := idemmem.NewStore(&idemmem.Config{NowFunc: func() time.Time {
		return time.Now().Add(time.Duration(skew.Load()))
	}})
	return store, &skew
}

// logBuffer collects an engine's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// stepsKeptLog is what the engine logs when an execution that recorded
// steps ends without completing.
const stepsKeptLog = "the steps are kept with the key"

// charger counts the charges of a fake card network.
type charger struct{ n atomic.Int32 }

func (c *charger) charge(context.Context) (string, error) {
	return "ch_" + strconv.Itoa(int(c.n.Add(1))), nil
}

// An execution charges the card in a step, then stalls past its lease
// (a process that froze, or died: nobody extends its lease). A retry
// takes the key over, gets the recorded charge instead of charging again,
// and completes; the stalled execution's completion is refused.
func TestStepOnceAcrossTakeover(t *testing.T) {
	store, skew := skewedStore()
	var logs logBuffer
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: logs.logger()})
	op := idem.Operation{Tenant: "t", Key: "pay-1", Fingerprint: []byte("POST /payments 19.00")}
	var card charger

	charged := make(chan struct{})
	taken := make(chan struct{})
	firstErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			id, err := idem.Step(ctx, "charge", card.charge)
			if err != nil {
				return idem.Result{}, err
			}
			close(charged)
			<-taken
			return idem.Result{Status: 201, Body: []byte(id + " by the first")}, nil
		})
		firstErr <- err
	}()
	select {
	case <-charged:
	case err := <-firstErr:
		t.Fatalf("the first Do ended before it charged: %v", err)
	}

	skew.Store(int64(2 * time.Minute)) // the first execution's lease ends
	var exec idem.Execution
	out, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		exec, _ = idem.ExecutionFromContext(ctx)
		id, err := idem.Step(ctx, "charge", card.charge)
		if err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201, Body: []byte(id + " by the retry")}, nil
	})
	close(taken)
	if err != nil || out.Replayed || string(out.Result.Body) != "ch_1 by the retry" {
		t.Fatalf("retry = %+v, %v; want a fresh run answering the recorded charge ch_1", out, err)
	}
	if n := card.n.Load(); n != 1 {
		t.Errorf("the card was charged %d times, want 1", n)
	}
	if !exec.Takeover || exec.RecoveryPoint != "charge" {
		t.Errorf("the retry's Execution: Takeover=%v RecoveryPoint=%q, want true and \"charge\"", exec.Takeover, exec.RecoveryPoint)
	}
	if err := <-firstErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("the stalled execution's Do = %v, want idem.ErrLeaseLost", err)
	}
	if !strings.Contains(logs.String(), stepsKeptLog) {
		t.Errorf("no warning that the stalled execution's steps are kept; logs:\n%s", logs.String())
	}
	rec, err := store.Get(context.Background(), op.Tenant, op.Key)
	if err != nil || rec.State != idem.StateComplete || string(rec.Result.Body) != "ch_1 by the retry" {
		t.Fatalf("record = %+v, %v; want the retry's completion", rec, err)
	}
}

// A handler that charged the card in a step, then failed, is rolled back
// and its key released, but its step is kept: the retry takes the key
// over and gets the charge back instead of charging again. On a
// transactional store (the business writes roll back) as on one without
// transactions, and whether the handler failed or its caller went away.
func TestStepKeptWhenReleased(t *testing.T) {
	for _, tc := range []struct {
		name          string
		transactional bool
		cancel        bool
	}{
		{name: "handler error"},
		{name: "transactional handler error", transactional: true},
		{name: "transactional caller gone", transactional: true, cancel: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var store idem.Store = idemmem.NewStore(nil)
			if tc.transactional {
				store = &trackingStore{Store: store.(*idemmem.Store)}
			}
			var logs logBuffer
			e := newEngine(t, store, &idem.Config{Logger: logs.logger()})
			op := idem.Operation{Tenant: "t", Key: "pay-1", Fingerprint: []byte("POST /payments 19.00")}
			var card charger
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			boom := errors.New("the receipt could not be written")
			_, err := e.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if _, err := idem.Step(ctx, "charge", card.charge); err != nil {
					return idem.Result{}, err
				}
				if tc.cancel {
					cancel()
					return idem.Result{Status: 201}, nil
				}
				return idem.Result{}, boom
			})
			if want := map[bool]error{false: boom, true: context.Canceled}[tc.cancel]; !errors.Is(err, want) {
				t.Fatalf("first Do = %v, want %v", err, want)
			}
			if !strings.Contains(logs.String(), stepsKeptLog) {
				t.Errorf("no warning that the steps are kept; logs:\n%s", logs.String())
			}
			rec, err := store.Get(context.Background(), op.Tenant, op.Key)
			if err != nil || rec.State != idem.StateInFlight || len(rec.Steps) != 1 || rec.Steps[0].Name != "charge" {
				t.Fatalf("record after the release = %+v, %v; want in flight with the charge step", rec, err)
			}

			// Another request under the key is refused: the card was
			// charged for this one.
			_, err = e.Do(context.Background(), idem.Operation{Tenant: op.Tenant, Key: op.Key, Fingerprint: []byte("POST /payments 5.00")},
				func(context.Context) (idem.Result, error) {
					t.Error("another request ran under a key whose steps are kept")
					return idem.Result{}, nil
				})
			if !errors.Is(err, idem.ErrFingerprintMismatch) {
				t.Errorf("another request under the key = %v, want idem.ErrFingerprintMismatch", err)
			}

			var exec idem.Execution
			out, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
				exec, _ = idem.ExecutionFromContext(ctx)
				id, err := idem.Step(ctx, "charge", card.charge)
				if err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: 201, Body: []byte(id)}, nil
			})
			if err != nil || out.Replayed || string(out.Result.Body) != "ch_1" {
				t.Fatalf("retry = %+v, %v; want a fresh run answering the recorded ch_1", out, err)
			}
			if n := card.n.Load(); n != 1 {
				t.Errorf("the card was charged %d times, want 1", n)
			}
			if !exec.Takeover || exec.RecoveryPoint != "charge" {
				t.Errorf("the retry's Execution: Takeover=%v RecoveryPoint=%q, want true and \"charge\"", exec.Takeover, exec.RecoveryPoint)
			}
		})
	}
}

// An execution that records nothing is released as before: the record
// goes, no warning about steps is logged, and the retry runs afresh.
func TestReleaseWithoutSteps(t *testing.T) {
	store := idemmem.NewStore(nil)
	var logs logBuffer
	e := newEngine(t, store, &idem.Config{Logger: logs.logger()})
	op := idem.Operation{Key: "k", Fingerprint: []byte("a")}
	boom := errors.New("boom")
	// A step whose fn fails records nothing: its effect did not happen.
	_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "", boom })
		return idem.Result{}, err
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the step's error", err)
	}
	if _, err := store.Get(context.Background(), op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record after a release without steps: %v, want it deleted", err)
	}
	if strings.Contains(logs.String(), stepsKeptLog) {
		t.Errorf("warned about kept steps when none was recorded:\n%s", logs.String())
	}
	var exec idem.Execution
	var ran bool
	_, err = e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		exec, _ = idem.ExecutionFromContext(ctx)
		_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { ran = true; return "ch_1", nil })
		return idem.Result{Status: 201}, err
	})
	if err != nil || !ran || exec.Takeover || exec.RecoveryPoint != "" {
		t.Errorf("retry: err=%v, step ran=%v, Takeover=%v, RecoveryPoint=%q; want a fresh execution that runs the step", err, ran, exec.Takeover, exec.RecoveryPoint)
	}
}

// When the lease was lost before the step's result could be recorded
// (another execution took the key over and completed), Step returns fn's
// result with an error wrapping ErrStepNotSaved and the store's
// ErrLeaseLost.
func TestStepNotSavedAfterLostLease(t *testing.T) {
	store, skew := skewedStore()
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	op := idem.Operation{Key: "pay-1", Fingerprint: []byte("a")}

	started := make(chan struct{})
	taken := make(chan struct{})
	type stepResult struct {
		id  string
		err error
	}
	stepped := make(chan stepResult, 1)
	firstErr := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(started)
			<-taken
			id, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_late", nil })
			stepped <- stepResult{id, err}
			return idem.Result{Status: 201}, err
		})
		firstErr <- err
	}()
	<-started
	skew.Store(int64(2 * time.Minute))
	if _, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 202}, nil
	}); err != nil {
		t.Fatalf("takeover: %v", err)
	}
	close(taken)
	r := <-stepped
	if r.id != "ch_late" || !errors.Is(r.err, idem.ErrStepNotSaved) || !errors.Is(r.err, idem.ErrLeaseLost) {
		t.Errorf("Step after the lease was lost = %q, %v; want fn's result and an error wrapping ErrStepNotSaved and ErrLeaseLost", r.id, r.err)
	}
	if err := <-firstErr; !errors.Is(err, idem.ErrStepNotSaved) {
		t.Errorf("Do = %v, want the handler's ErrStepNotSaved", err)
	}
	rec, err := store.Get(context.Background(), op.Tenant, op.Key)
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 202 || len(rec.Steps) != 0 {
		t.Errorf("record = %+v, %v; want the taker's completion, without the late step", rec, err)
	}
}

// Outside an execution (a request without a key), Step runs fn every
// time, and DownstreamKey and ExecutionFromContext have nothing to say.
func TestStepOutsideExecution(t *testing.T) {
	var card charger
	for i := 1; i <= 2; i++ {
		id, err := idem.Step(context.Background(), "charge", card.charge)
		if err != nil || id != "ch_"+strconv.Itoa(i) {
			t.Fatalf("Step outside an execution = %q, %v; want fn's ch_%d", id, err, i)
		}
	}
	if k := idem.DownstreamKey(context.Background(), "charge"); k != "" {
		t.Errorf("DownstreamKey outside an execution = %q, want \"\"", k)
	}
	if _, ok := idem.ExecutionFromContext(context.Background()); ok {
		t.Error("ExecutionFromContext found an execution in a bare context")
	}
}

// noSteps hides idemmem's SaveStep: a store without recovery points.
type noSteps struct{ idem.Store }

// On a store without recovery points, Step refuses before running fn:
// the caller learns it at its first test, not after a double charge.
func TestStepUnsupported(t *testing.T) {
	e := newEngine(t, noSteps{idemmem.NewStore(nil)}, nil)
	_, err := e.Do(context.Background(), idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			t.Error("fn ran on a store that cannot record its result")
			return "", nil
		})
		return idem.Result{}, err
	})
	if !errors.Is(err, idem.ErrStepsUnsupported) {
		t.Errorf("Step on a store without StepStore = %v, want idem.ErrStepsUnsupported", err)
	}
}

// Step refuses an empty name, and a recorded result that does not decode
// into the type asked for.
func TestStepBadUse(t *testing.T) {
	e := newEngine(t, idemmem.NewStore(nil), &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	op := idem.Operation{Key: "k"}
	_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		if _, err := idem.Step(ctx, "", func(context.Context) (int, error) { return 1, nil }); err == nil {
			t.Error("Step with an empty name succeeded")
		}
		if _, err := idem.Step(ctx, "n", func(context.Context) (string, error) { return "not a number", nil }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{}, errors.New("fail, to keep the step")
	})
	if err == nil {
		t.Fatal("first Do succeeded")
	}
	_, err = e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "n", func(context.Context) (int, error) {
			t.Error("fn ran although a result is recorded")
			return 0, nil
		})
		return idem.Result{}, err
	})
	if err == nil || !strings.Contains(err.Error(), "does not decode") {
		t.Errorf("Step whose recorded result does not decode = %v, want a decoding error", err)
	}
}

// DownstreamKey is the same in every execution of one operation, a
// takeover included, and differs between tenants, keys and step names,
// ambiguous concatenations included. It reveals neither tenant nor key.
func TestDownstreamKey(t *testing.T) {
	e := newEngine(t, idemmem.NewStore(nil), &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	keyOf := func(tenant, key, name string, fail bool) string {
		t.Helper()
		var got string
		_, err := e.Do(context.Background(), idem.Operation{Tenant: tenant, Key: key}, func(ctx context.Context) (idem.Result, error) {
			got = idem.DownstreamKey(ctx, name)
			// A step, so that a failure keeps the record and the next
			// execution is a takeover.
			if _, err := idem.Step(ctx, "s", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return idem.Result{}, err
			}
			if fail {
				return idem.Result{}, errors.New("fail")
			}
			return idem.Result{Status: 201}, nil
		})
		if (err != nil) != fail {
			t.Fatalf("Do(%q, %q) = %v", tenant, key, err)
		}
		return got
	}
	first := keyOf("acme", "pay-1", "charge", true)
	again := keyOf("acme", "pay-1", "charge", false) // the takeover
	if first != again {
		t.Errorf("DownstreamKey changed across executions: %q then %q", first, again)
	}
	if len(first) != 64 {
		t.Errorf("DownstreamKey = %q, want 64 hexadecimal characters", first)
	}
	if _, err := hex.DecodeString(first); err != nil || strings.ToLower(first) != first {
		t.Errorf("DownstreamKey = %q, not lower-case hexadecimal", first)
	}
	seen := map[string]string{first: "acme/pay-1/charge"}
	for _, c := range []struct{ tenant, key, name string }{
		{"other", "pay-1", "charge"},
		{"acme", "pay-2", "charge"},
		{"acme", "pay-3", "refund"},
		{"acme", "pay-3", "charge"},
		{"a", "bc", "x"},
		{"ab", "c", "x"},
		{"", "abc", "x"},
		{"abc", "x", ""},
	} {
		k := keyOf(c.tenant, c.key, c.name, false)
		what := c.tenant + "/" + c.key + "/" + c.name
		if prev, dup := seen[k]; dup {
			t.Errorf("%s and %s share the downstream key %q", prev, what, k)
		}
		seen[k] = what
	}
	if strings.Contains(first, "acme") || strings.Contains(first, "pay-1") {
		t.Errorf("DownstreamKey %q reveals the tenant or the key", first)
	}
}

// The handler sees whether it took the key over, and the last step the
// earlier executions recorded.
func TestExecutionTakeover(t *testing.T) {
	store, skew := skewedStore()
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	run := func(key string, steps []string, fail bool) idem.Execution {
		t.Helper()
		var exec idem.Execution
		_, err := e.Do(context.Background(), idem.Operation{Key: key}, func(ctx context.Context) (idem.Result, error) {
			exec, _ = idem.ExecutionFromContext(ctx)
			for _, name := range steps {
				if _, err := idem.Step(ctx, name, func(context.Context) (bool, error) { return true, nil }); err != nil {
					return idem.Result{}, err
				}
			}
			if fail {
				return idem.Result{}, errors.New("fail")
			}
			return idem.Result{Status: 201}, nil
		})
		if (err != nil) != fail {
			t.Fatalf("Do(%q) = %v", key, err)
		}
		return exec
	}
	if x := run("fresh", nil, false); x.Takeover || x.RecoveryPoint != "" || x.Key != "fresh" || x.LeaseToken == 0 || x.Store != "memory" {
		t.Errorf("fresh execution: %+v; want no takeover, no recovery point", x)
	}
	run("stepped", []string{"reserve", "charge"}, true)
	if x := run("stepped", []string{"reserve", "charge", "email"}, false); !x.Takeover || x.RecoveryPoint != "charge" {
		t.Errorf("execution after one that recorded reserve, charge: Takeover=%v RecoveryPoint=%q; want true and \"charge\"", x.Takeover, x.RecoveryPoint)
	}

	// An execution that dies without steps: the next one takes over, with
	// no recovery point.
	started := make(chan struct{})
	finish := make(chan struct{})
	defer close(finish)
	go func() {
		_, _ = e.Do(context.Background(), idem.Operation{Key: "dead"}, func(context.Context) (idem.Result, error) {
			close(started)
			<-finish
			return idem.Result{}, nil
		})
	}()
	<-started
	skew.Store(int64(2 * time.Minute))
	if x := run("dead", nil, false); !x.Takeover || x.RecoveryPoint != "" {
		t.Errorf("execution after a dead one without steps: Takeover=%v RecoveryPoint=%q; want true and \"\"", x.Takeover, x.RecoveryPoint)
	}
}

// Steps of one execution may run concurrently under different names:
// each runs once, each is recorded, and a retry gets every one back.
func TestConcurrentSteps(t *testing.T) {
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	op := idem.Operation{Key: "fan-out"}
	const n = 16
	var calls [n]atomic.Int32
	runAll := func(ctx context.Context) ([]string, error) {
		got := make([]string, n)
		errs := make([]error, n)
		atOnce(n, func(i int) {
			got[i], errs[i] = idem.Step(ctx, "notify-"+strconv.Itoa(i), func(context.Context) (string, error) {
				return fmt.Sprintf("sent-%d-%d", i, calls[i].Add(1)), nil
			})
		})
		return got, errors.Join(errs...)
	}
	_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		if _, err := runAll(ctx); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{}, errors.New("fail after the steps")
	})
	if err == nil || errors.Is(err, idem.ErrStepNotSaved) {
		t.Fatalf("first Do = %v, want the handler's failure", err)
	}
	rec, err := store.Get(context.Background(), op.Tenant, op.Key)
	if err != nil || len(rec.Steps) != n {
		t.Fatalf("record = %+v, %v; want %d steps", rec, err, n)
	}
	var got []string
	_, err = e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		var err error
		got, err = runAll(ctx)
		return idem.Result{Status: 200}, err
	})
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	for i := range n {
		if c := calls[i].Load(); c != 1 {
			t.Errorf("step %d ran %d times, want 1", i, c)
		}
		if want := fmt.Sprintf("sent-%d-1", i); got[i] != want {
			t.Errorf("step %d answered %q on the retry, want the recorded %q", i, got[i], want)
		}
	}
}

// Every way an execution that recorded a step can end without completing
// logs that its steps are kept, and keeps them: the answer it marked
// NotExecuted, a panic on a transactional store (rolled back, released),
// a panic on a store without transactions (held until its lease ends).
func TestStepsKeptWarning(t *testing.T) {
	for _, tc := range []struct {
		name          string
		transactional bool
		end           func(ctx context.Context) (idem.Result, error)
	}{
		{name: "NotExecuted", end: func(ctx context.Context) (idem.Result, error) {
			idem.NotExecuted(ctx)
			return idem.Result{Status: 400}, nil
		}},
		{name: "transactional panic", transactional: true, end: func(context.Context) (idem.Result, error) { panic("boom") }},
		{name: "panic", end: func(context.Context) (idem.Result, error) { panic("boom") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var store idem.Store = idemmem.NewStore(nil)
			if tc.transactional {
				store = &trackingStore{Store: store.(*idemmem.Store)}
			}
			var logs logBuffer
			e := newEngine(t, store, &idem.Config{Logger: logs.logger()})
			op := idem.Operation{Key: "k", Fingerprint: []byte("a")}
			_, _ = e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
				if _, err := idem.Step(ctx, "charge", func(context.Context) (int, error) { return 1, nil }); err != nil {
					return idem.Result{}, err
				}
				return tc.end(ctx)
			})
			if !strings.Contains(logs.String(), stepsKeptLog) {
				t.Errorf("no warning that the steps are kept; logs:\n%s", logs.String())
			}
			rec, err := store.Get(context.Background(), op.Tenant, op.Key)
			if err != nil || rec.State != idem.StateInFlight || len(rec.Steps) != 1 {
				t.Errorf("record = %+v, %v; want in flight with its step", rec, err)
			}
		})
	}
}

// failingSteps is a memory store whose SaveStep fails, as a full or
// unreachable store's would.
type failingSteps struct{ *idemmem.Store }

func (failingSteps) SaveStep(context.Context, idem.SaveStepParams) error {
	return errors.New("OOM command not allowed when used memory > 'maxmemory'")
}

// TestStepNotSavedKeepsKey: a step whose effect happened but whose record
// failed must not be run again at once: the handler's ErrStepNotSaved
// leaves the key in flight until its lease ends, whatever the store.
func TestStepNotSavedKeepsKey(t *testing.T) {
	store := failingSteps{idemmem.NewStore(nil)}
	e := newEngine(t, store, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	op := idem.Operation{Tenant: "acme", Key: "pay-oom", Fingerprint: []byte("a")}
	charges := 0
	pay := func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			charges++
			return "ch_1", nil
		})
		return idem.Result{Status: 201}, err
	}
	if _, err := e.Do(context.Background(), op, pay); !errors.Is(err, idem.ErrStepNotSaved) {
		t.Fatalf("Do = %v, want ErrStepNotSaved", err)
	}
	if _, err := e.Do(context.Background(), op, pay); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("retry = %v, want ErrInFlight (the key kept until its lease ends)", err)
	}
	if charges != 1 {
		t.Fatalf("%d charges, want 1", charges)
	}
}
