package idem_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// recorder is a tracer that writes down what it is told.
type recorder struct {
	mu     sync.Mutex
	name   string
	events []string
	ends   []idem.TraceOperationEndData
}

type ctxKey struct{}

func (r *recorder) add(e string) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) TraceOperationStart(ctx context.Context, d idem.TraceOperationStartData) context.Context {
	r.add("start " + d.Key)
	chain, _ := ctx.Value(ctxKey{}).(string)
	return context.WithValue(ctx, ctxKey{}, chain+r.name)
}

func (r *recorder) TraceOperationEnd(ctx context.Context, d idem.TraceOperationEndData) {
	r.add("end " + d.Outcome.String())
	r.mu.Lock()
	r.ends = append(r.ends, d)
	r.mu.Unlock()
}

func (r *recorder) TraceStoreStart(ctx context.Context, d idem.TraceStoreStartData) context.Context {
	return ctx
}

func (r *recorder) TraceStoreEnd(ctx context.Context, d idem.TraceStoreEndData) {
	chain, _ := ctx.Value(ctxKey{}).(string)
	r.add(d.Operation.String() + " " + storeResult(d.Err) + " " + chain)
}

// storeResult names a store call's end as idemprom and idemotel do.
func storeResult(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, idem.ErrLeaseLost):
		return "lease_lost"
	}
	return "error"
}

func (r *recorder) TraceLease(ctx context.Context, d idem.TraceLeaseData) {
	r.add("lease " + d.Event.String())
}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// TestTracerSeesEveryOutcome runs one operation of each kind and checks
// what the tracer was told, store calls included, and that the context
// its start returned is the one the handler and the store calls get.
func TestTracerSeesEveryOutcome(t *testing.T) {
	rec := &recorder{name: "r"}
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: rec, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := func(body string) func(ctx context.Context) (idem.Result, error) {
		return func(ctx context.Context) (idem.Result, error) {
			if ctx.Value(ctxKey{}) != "r" {
				t.Errorf("the handler's context lacks the tracer's value")
			}
			return idem.Result{Status: 201, Body: []byte(body)}, nil
		}
	}
	for _, tc := range []struct {
		name string
		run  func() error
		want []string
	}{
		{"executed", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "a", Fingerprint: []byte("1")}, ok("hello"))
			return err
		},
			[]string{"start a", "claim ok r", "begin ok r", "complete ok r", "end executed"}},
		{"replayed", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "a", Fingerprint: []byte("1")}, ok(""))
			return err
		},
			[]string{"start a", "claim ok r", "end replayed"}},
		{"mismatch", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "a", Fingerprint: []byte("2")}, ok(""))
			return err
		},
			[]string{"start a", "claim ok r", "end fingerprint_mismatch"}},
		{"handler error", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "b"}, func(ctx context.Context) (idem.Result, error) { return idem.Result{}, errors.New("no") })
			return err
		}, []string{"start b", "claim ok r", "begin ok r", "rollback ok r", "release ok r", "end handler_error"}},
		{"not executed", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "c"}, func(ctx context.Context) (idem.Result, error) {
				idem.NotExecuted(ctx)
				return idem.Result{Status: 400}, nil
			})
			return err
		}, []string{"start c", "claim ok r", "begin ok r", "rollback ok r", "release ok r", "end not_executed"}},
		{"panic", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "d"}, func(ctx context.Context) (idem.Result, error) { panic("boom") })
			return err
		}, []string{"start d", "claim ok r", "begin ok r", "rollback ok r", "end handler_panic"}},
		{"step", func() error {
			_, err := engine.Do(ctx, idem.Operation{Key: "s"}, func(ctx context.Context) (idem.Result, error) {
				if _, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) { return "ch_1", nil }); err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: 201}, nil
			})
			return err
		}, []string{"start s", "claim ok r", "begin ok r", "save_step ok r", "complete ok r", "end executed"}},
		{"invalid key", func() error { _, err := engine.Do(ctx, idem.Operation{Key: ""}, ok("")); return err },
			[]string{"start ", "end invalid_key"}},
	} {
		tc.run() //nolint:errcheck // the tracer's view is what is checked
		if got := rec.take(); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s: traced\n  %q\nwant\n  %q", tc.name, got, tc.want)
		}
	}
	executed, replayed := rec.ends[0], rec.ends[1]
	if executed.ResponseBytes != 5 || executed.Store != "memory" || executed.Err != nil {
		t.Errorf("executed: %+v", executed)
	}
	if replayed.ResponseBytes != 5 || replayed.ReplayAge < 0 || replayed.ReplayAge > time.Minute {
		t.Errorf("replayed: %+v", replayed)
	}
	if err := engine.Close(ctx); err != nil {
		t.Fatal(err)
	}
	engine.Do(ctx, idem.Operation{Key: "e"}, ok("")) //nolint:errcheck
	if got := rec.take(); strings.Join(got, "|") != "start e|end closed" {
		t.Errorf("after Close: %q", got)
	}
}

// TestLeaseLostTracedAndLoggedOnce: a lease lost at the completion, on a
// store without transactions, is one lease event and one warning.
func TestLeaseLostTracedAndLoggedOnce(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	now := time.Unix(1e9, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	rec := &recorder{name: "r"}
	engine, err := idem.NewEngine(idemmem.NewStore(&idemmem.Config{NowFunc: clock}), &idem.Config{
		Tracer: rec, Lease: time.Minute, Heartbeat: -1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Key: "k"}
	_, err = engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		mu.Lock()
		now = now.Add(2 * time.Minute)
		mu.Unlock()
		// A retry takes the key over meanwhile.
		if _, err := engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{}, nil
		}); err != nil {
			t.Errorf("takeover: %v", err)
		}
		return idem.Result{}, nil
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do: %v, want ErrLeaseLost", err)
	}
	lost := 0
	for _, e := range rec.take() {
		if e == "lease lost" {
			lost++
		}
	}
	if lost != 1 {
		t.Errorf("%d lease-lost events, want 1", lost)
	}
	if n := strings.Count(logs.String(), "lease lost to a takeover"); n != 1 {
		t.Errorf("%d lease-lost lines, want 1:\n%s", n, logs.String())
	}
}

// TestMultiTracer: every tracer is told everything, each starting from
// the context the previous one returned.
func TestMultiTracer(t *testing.T) {
	a, b := &recorder{name: "a"}, &recorder{name: "b"}
	if idem.MultiTracer() != nil || idem.MultiTracer(nil, nil) != nil {
		t.Fatal("MultiTracer of nothing is not nil")
	}
	if idem.MultiTracer(nil, a) != idem.Tracer(a) {
		t.Fatal("MultiTracer of one tracer is not that tracer")
	}
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: idem.MultiTracer(a, nil, b), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var seen any
	engine.Do(context.Background(), idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) { //nolint:errcheck
		seen = ctx.Value(ctxKey{})
		return idem.Result{}, nil
	})
	if seen != "ab" {
		t.Fatalf("the handler's context says %v, want the chain ab", seen)
	}
	want := "start k|claim ok ab|begin ok ab|complete ok ab|end executed"
	for _, r := range []*recorder{a, b} {
		if got := strings.Join(r.take(), "|"); got != want {
			t.Errorf("%s: %s, want %s", r.name, got, want)
		}
	}
}

// TestNoTracerNoAllocation: without a tracer, an operation allocates what
// it did before tracers existed; with one that allocates nothing itself,
// no more.
func TestNoTracerNoAllocation(t *testing.T) {
	run := func(tr idem.Tracer) float64 {
		engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: tr, Logger: slog.New(slog.DiscardHandler), Heartbeat: -1})
		if err != nil {
			t.Fatal(err)
		}
		fn := func(ctx context.Context) (idem.Result, error) { return idem.Result{Status: 200}, nil }
		op := idem.Operation{Key: "k"}
		engine.Do(context.Background(), op, fn) //nolint:errcheck
		return testing.AllocsPerRun(100, func() {
			engine.Do(context.Background(), op, fn) //nolint:errcheck // replays
		})
	}
	if off, on := run(nil), run(nopTracer{}); on != off {
		t.Fatalf("a replay allocates %v times with a tracer that allocates nothing, %v without", on, off)
	}
}

type nopTracer struct{}

func (nopTracer) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}
func (nopTracer) TraceOperationEnd(context.Context, idem.TraceOperationEndData) {}
func (nopTracer) TraceStoreStart(ctx context.Context, _ idem.TraceStoreStartData) context.Context {
	return ctx
}
func (nopTracer) TraceStoreEnd(context.Context, idem.TraceStoreEndData) {}

// refusingSteps is an idemmem store whose SaveStep fails, as a store that
// went away between the step's effect and its record.
type refusingSteps struct{ *idemmem.Store }

func (refusingSteps) SaveStep(context.Context, idem.SaveStepParams) error {
	return errors.New("connection reset")
}

// TestStepNotSavedTraced: a step whose record failed is a failed
// save_step call and the operation's step_not_saved outcome.
func TestStepNotSavedTraced(t *testing.T) {
	rec := &recorder{name: "r"}
	engine, err := idem.NewEngine(refusingSteps{idemmem.NewStore(nil)}, &idem.Config{Tracer: rec, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.Do(context.Background(), idem.Operation{Key: "s"}, func(ctx context.Context) (idem.Result, error) {
		idem.Step(ctx, "charge", func(ctx context.Context) (string, error) { return "ch_1", nil }) //nolint:errcheck // the engine sees it
		return idem.Result{Status: 201}, nil
	})
	if !errors.Is(err, idem.ErrStepNotSaved) {
		t.Fatalf("Do: %v, want ErrStepNotSaved", err)
	}
	want := "start s|claim ok r|begin ok r|save_step error r|rollback ok r|end step_not_saved"
	// After the rollback the engine tries the step's record again while
	// it holds the lease (steps_later.go), concurrently with the end of
	// the operation: those later tries are not part of the sequence.
	var calls []string
	rolledBack := false
	for _, c := range rec.take() {
		if rolledBack && c == "save_step error r" {
			continue
		}
		rolledBack = rolledBack || c == "rollback ok r"
		calls = append(calls, c)
	}
	if got := strings.Join(calls, "|"); got != want {
		t.Fatalf("traced %s, want %s", got, want)
	}
}
