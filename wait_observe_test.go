package idem_test

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
	"github.com/idem-go/idem/idemmem"
)

// waitTracer records what the engine reports of its operations, lease
// events and store calls.
type waitTracer struct {
	mu     sync.Mutex
	ends   []idem.TraceOperationEndData
	leases []idem.LeaseEvent
	gets   []error
}

func (w *waitTracer) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	return ctx
}

func (w *waitTracer) TraceOperationEnd(_ context.Context, d idem.TraceOperationEndData) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ends = append(w.ends, d)
}

func (w *waitTracer) TraceLease(_ context.Context, d idem.TraceLeaseData) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.leases = append(w.leases, d.Event)
}

func (w *waitTracer) TraceStoreStart(ctx context.Context, _ idem.TraceStoreStartData) context.Context {
	return ctx
}

func (w *waitTracer) TraceStoreEnd(_ context.Context, d idem.TraceStoreEndData) {
	if d.Operation != idem.StoreGet {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gets = append(w.gets, d.Err)
}

func (w *waitTracer) failedGets() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, r := range w.gets {
		if r != nil {
			n++
		}
	}
	return n
}

// end returns the last operation end reported.
func (w *waitTracer) end() idem.TraceOperationEndData {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ends[len(w.ends)-1]
}

// stateStore is an idemmem store that counts its reads, whole (Get) and
// of the state alone (GetState), and can hide its records from them
// (hide) or fail them (fail). It is no Watcher: the engine polls it.
type stateStore struct {
	*idemmem.Store
	gets, states atomic.Int64
	hide, fail   atomic.Bool
}

var errReadFails = errors.New("the store fails every read")

func (s *stateStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	s.gets.Add(1)
	switch {
	case s.fail.Load():
		return nil, errReadFails
	case s.hide.Load():
		return nil, idem.ErrNotFound
	}
	return s.Store.Get(ctx, tenant, key)
}

func (s *stateStore) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	s.states.Add(1)
	switch {
	case s.fail.Load():
		return nil, errReadFails
	case s.hide.Load():
		return nil, idem.ErrNotFound
	}
	return s.Store.GetState(ctx, tenant, key)
}

// Watch hides idemmem's: the engine polls.
func (s *stateStore) Watch() {}

func newStateStore(t *testing.T) *stateStore {
	t.Helper()
	return &stateStore{Store: idemmem.NewStore(nil)}
}

// The poller of a key in flight reads its state, never its payload: the
// record's result is read once, when it completed.
func TestWaitPollReadsStateOnly(t *testing.T) {
	st := newStateStore(t)
	e, err := idem.NewEngine(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	idem.SetWaitPoll(e, time.Millisecond, time.Millisecond)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
	release := hold(t, e, op, idem.Result{Status: 201, Body: []byte("done")})
	op.WaitInFlight = time.Minute
	done := make(chan error, 1)
	go func() {
		out, err := e.Do(context.Background(), op, mustNotRun(t))
		if err == nil && !out.Replayed {
			err = errors.New("not replayed")
		}
		done <- err
	}()
	waitFor(t, "the poller to read the state five times", func() bool { return st.states.Load() >= 5 })
	release()
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v; want the completion replayed", err)
	}
	if n := st.gets.Load(); n != 1 {
		t.Errorf("the poller read the whole record %d times (and the state %d times); want once, when it completed", n, st.states.Load())
	}
}

// A waiter that takes a key over (its first execution's lease ended) is
// counted, logged and traced as a takeover, as a retry would be.
func TestWaiterTakeoverReported(t *testing.T) {
	mem := idemmem.NewStore(nil)
	var logs bytes.Buffer
	var logMu sync.Mutex
	tr := &waitTracer{}
	e, err := idem.NewEngine(mem, &idem.Config{
		Lease: 100 * time.Millisecond, Heartbeat: -1, Tracer: tr,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
	// The first execution stalls past its lease, without a heartbeat,
	// until the test ends; its completion then finds its lease lost.
	running, stop := make(chan struct{}), make(chan struct{})
	defer close(stop)
	go func() {
		_, _ = e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
			close(running)
			<-stop
			return idem.Result{Status: 201}, nil
		})
	}()
	<-running
	op.WaitInFlight = time.Minute
	out, err := e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 202}, nil
	})
	if err != nil || out.Replayed || out.Result.Status != 202 {
		t.Fatalf("waiter = %+v, %v; want its own execution after the takeover", out, err)
	}
	if end := tr.end(); !end.Takeover || end.Outcome != idem.OutcomeExecuted {
		t.Errorf("waiter's operation traced as %+v; want an execution with Takeover", end)
	}
	tr.mu.Lock()
	leases := append([]idem.LeaseEvent(nil), tr.leases...)
	tr.mu.Unlock()
	if len(leases) != 1 || leases[0] != idem.LeaseTakeover {
		t.Errorf("lease events %v; want one takeover", leases)
	}
	logMu.Lock()
	logged := logs.String()
	logMu.Unlock()
	if !strings.Contains(logged, "taken over") {
		t.Errorf("the takeover was not logged; the log:\n%s", logged)
	}
}

// A waiter whose client left (Operation.WaitContext) ran nothing: it is
// cancelled, not a failed handler, although Do's own context lives on.
func TestWaiterLeftIsCancelled(t *testing.T) {
	mem := idemmem.NewStore(nil)
	tr := &waitTracer{}
	e, err := idem.NewEngine(mem, &idem.Config{Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
	release := hold(t, e, op, idem.Result{Status: 201})
	defer release()
	client, leave := context.WithCancel(context.Background())
	op.WaitInFlight, op.WaitContext = time.Minute, client
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, mustNotRun(t))
		done <- err
	}()
	waitFor(t, "the duplicate to wait", func() bool { return idem.WaitWaiters(e, "t", "k") == 1 })
	leave()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("waiter whose client left: %v, want context.Canceled", err)
	}
	if end := tr.end(); end.Outcome != idem.OutcomeCancelled {
		t.Errorf("waiter whose client left traced as %v; want cancelled", end.Outcome)
	}
}

// A waiter whose claim loses to a record completed meanwhile replays it
// with the record's age, as a retry would.
func TestWaiterReplayAge(t *testing.T) {
	st := newStateStore(t)
	tr := &waitTracer{}
	e, err := idem.NewEngine(st, &idem.Config{Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetWaitPoll(e, time.Millisecond, time.Millisecond)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
	release := hold(t, e, op, idem.Result{Status: 201})
	op.WaitInFlight = time.Minute
	done := make(chan error, 1)
	go func() {
		out, err := e.Do(context.Background(), op, mustNotRun(t))
		if err == nil && !out.Replayed {
			err = errors.New("not replayed")
		}
		done <- err
	}()
	waitFor(t, "the poller to read", func() bool { return st.states.Load()+st.gets.Load() >= 1 })
	// The poller finds no record, and the waiter claims, until its claim
	// finds the record completed.
	st.hide.Store(true)
	release()
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v; want the completion replayed", err)
	}
	if end := tr.end(); end.Outcome != idem.OutcomeReplayed || end.ReplayAge <= 0 {
		t.Errorf("waiter traced as %v with replay age %v; want replayed, with the record's age", end.Outcome, end.ReplayAge)
	}
}

// The poller's reads are traced: a store that fails every poll shows.
func TestWaitPollFailuresTraced(t *testing.T) {
	st := newStateStore(t)
	tr := &waitTracer{}
	e, err := idem.NewEngine(st, &idem.Config{Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	idem.SetWaitPoll(e, time.Millisecond, time.Millisecond)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
	release := hold(t, e, op, idem.Result{Status: 201})
	defer release()
	st.fail.Store(true)
	op.WaitInFlight = 200 * time.Millisecond
	if _, err := e.Do(context.Background(), op, mustNotRun(t)); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("waiter behind a failing store: %v, want idem.ErrInFlight at its limit", err)
	}
	if n := tr.failedGets(); n == 0 {
		t.Error("the poller's failed reads were not traced")
	}
}

// mustNotRun is the function of a duplicate that must not run.
func mustNotRun(t *testing.T) func(context.Context) (idem.Result, error) {
	return func(context.Context) (idem.Result, error) {
		t.Error("a waiting duplicate ran its function")
		return idem.Result{}, errors.New("must not run")
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
