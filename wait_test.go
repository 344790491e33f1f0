package idem_test

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// pollingStore is an idemmem store seen through idem.Store alone: not a
// Watcher, so the engine can only poll it. It counts the reads.
type pollingStore struct {
	idem.Store
	gets atomic.Int64
}

func (s *pollingStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	s.gets.Add(1)
	return s.Store.Get(ctx, tenant, key)
}

// silentStore is a Watcher whose notifications are all lost: its channels
// never close.
type silentStore struct {
	pollingStore
	watches atomic.Int64
}

func (s *silentStore) Watch(ctx context.Context, tenant, key string) (<-chan struct{}, func(), error) {
	s.watches.Add(1)
	return make(chan struct{}), func() {}, nil
}

// hold starts op on e with a function that runs until the returned
// release is called, and returns once the function runs.
func hold(t *testing.T, e *idem.Engine, op idem.Operation, res idem.Result) (release func()) {
	t.Helper()
	running := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(running)
			<-stop
			return res, nil
		})
		done <- err
	}()
	select {
	case <-running:
	case err := <-done:
		t.Fatalf("the first execution ended before it ran: %v", err)
	}
	return func() {
		close(stop)
		if err := <-done; err != nil {
			t.Errorf("first execution: %v", err)
		}
	}
}

// waitFor polls cond until it holds, and fails the test after a generous
// bound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

// A thousand duplicates waiting on one key share one poller: one
// goroutine, and reads at the poller's pace, not a thousand of each.
func TestWaitThousandWaitersOnePoller(t *testing.T) {
	const waiters = 1000
	store := &pollingStore{Store: idemmem.NewStore(nil)}
	e := newEngine(t, store, nil)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), WaitInFlight: time.Minute}
	want := idem.Result{Status: 201, Body: []byte("first")}
	release := hold(t, e, op, want)

	base := runtime.NumGoroutine()
	outcomes := make([]idem.Outcome, waiters)
	errs := make([]error, waiters)
	all := make(chan struct{})
	go func() {
		defer close(all)
		atOnce(waiters, func(i int) {
			outcomes[i], errs[i] = e.Do(context.Background(), op, func(context.Context) (idem.Result, error) {
				t.Error("a duplicate ran")
				return idem.Result{}, nil
			})
		})
	}()
	waitFor(t, "every duplicate to wait", func() bool { return idem.WaitWaiters(e, "t", "k") == waiters })
	readsBefore := store.gets.Load()
	time.Sleep(300 * time.Millisecond) // let the poller reach its longest pause
	reads := store.gets.Load() - readsBefore
	goroutines := runtime.NumGoroutine() - base
	release()
	<-all

	if n := idem.WaitPollers(e); n != 1 {
		t.Errorf("%d duplicates waiting on one key started %d pollers, want 1", waiters, n)
	}
	// The waiters' goroutines, atOnce's, and the poller: nothing per
	// waiter beyond its own.
	if goroutines > waiters+10 {
		t.Errorf("%d goroutines while %d duplicates wait, want at most %d", goroutines, waiters, waiters+10)
	}
	// At the poller's pace (10ms doubling to 250ms) a few reads in 300ms;
	// one per waiter would be a thousand.
	if reads > 20 {
		t.Errorf("%d reads of the record in 300ms while %d duplicates wait, want a few", reads, waiters)
	}
	for i, err := range errs {
		if err != nil || !outcomes[i].Replayed {
			t.Fatalf("duplicate %d = %+v, %v; want a replay", i, outcomes[i], err)
		}
		checkOutcome(t, outcomes[i].Result, want)
	}
}

// A watcher whose notifications are lost does not make the waiters wait
// until their deadline: the poller reads behind it.
func TestWaitPollsBehindSilentWatcher(t *testing.T) {
	store := &silentStore{pollingStore: pollingStore{Store: idemmem.NewStore(nil)}}
	e := newEngine(t, store, nil)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), WaitInFlight: time.Minute}
	want := idem.Result{Status: 201, Body: []byte("first")}
	release := hold(t, e, op, want)
	done := make(chan struct{})
	var out idem.Outcome
	var err error
	go func() {
		defer close(done)
		out, err = e.Do(context.Background(), op, nil)
	}()
	waitFor(t, "the duplicate to wait", func() bool { return idem.WaitWaiters(e, "t", "k") == 1 })
	release()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate still waits after the execution completed, its watcher being silent")
	}
	if err != nil || !out.Replayed {
		t.Fatalf("duplicate = %+v, %v; want a replay", out, err)
	}
	checkOutcome(t, out.Result, want)
	if store.watches.Load() == 0 {
		t.Error("the engine never called Watch on a store that is a Watcher")
	}
}

// With a watcher, a waiter learns of the completion from it: here the
// poller would not read again for an hour.
func TestWaitWokenByWatcher(t *testing.T) {
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, nil)
	idem.SetWaitPoll(e, time.Hour, time.Hour)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), WaitInFlight: time.Minute}
	want := idem.Result{Status: 201, Body: []byte("first")}
	release := hold(t, e, op, want)
	done := make(chan struct{})
	var out idem.Outcome
	var err error
	go func() {
		defer close(done)
		out, err = e.Do(context.Background(), op, nil)
	}()
	waitFor(t, "the duplicate to wait", func() bool { return idem.WaitWaiters(e, "t", "k") == 1 })
	release()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the duplicate still waits after the execution completed: the store's Watch did not wake it")
	}
	if err != nil || !out.Replayed {
		t.Fatalf("duplicate = %+v, %v; want a replay", out, err)
	}
}

// Each waiter gets a result of its own: one that changes its copy (a
// front end adding a header) changes no other.
func TestWaitResultsNotShared(t *testing.T) {
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, nil)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), WaitInFlight: time.Minute}
	want := idem.Result{Status: 201, Header: map[string][]string{"Location": {"/orders/1"}}, Body: []byte("first")}
	release := hold(t, e, op, want)
	const waiters = 2
	outcomes := make([]idem.Outcome, waiters)
	errs := make([]error, waiters)
	all := make(chan struct{})
	go func() {
		defer close(all)
		atOnce(waiters, func(i int) { outcomes[i], errs[i] = e.Do(context.Background(), op, nil) })
	}()
	waitFor(t, "both duplicates to wait", func() bool { return idem.WaitWaiters(e, "t", "k") == waiters })
	release()
	<-all
	for i, err := range errs {
		if err != nil || !outcomes[i].Replayed {
			t.Fatalf("duplicate %d = %+v, %v; want a replay", i, outcomes[i], err)
		}
	}
	outcomes[0].Result.Header["Location"][0] = "/changed"
	outcomes[0].Result.Body[0] = 'X'
	checkOutcome(t, outcomes[1].Result, want)
}

// Without WaitInFlight nothing waits: ErrInFlight at once, as always.
func TestWaitOff(t *testing.T) {
	e := newEngine(t, idemmem.NewStore(nil), nil)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp")}
	release := hold(t, e, op, idem.Result{Status: 201})
	defer release()
	if _, err := e.Do(context.Background(), op, nil); !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("Do without WaitInFlight on a key in flight = %v, want idem.ErrInFlight", err)
	}
	if n := idem.WaitPollers(e); n != 0 {
		t.Errorf("%d pollers started without WaitInFlight, want 0", n)
	}
}

func checkOutcome(t *testing.T, got, want idem.Result) {
	t.Helper()
	if got.Status != want.Status || string(got.Body) != string(want.Body) || len(got.Header) != len(want.Header) {
		t.Fatalf("result = %d %q %v, want %d %q %v", got.Status, got.Body, got.Header, want.Status, want.Body, want.Header)
	}
	for k, v := range want.Header {
		if len(got.Header[k]) != len(v) || (len(v) > 0 && got.Header[k][0] != v[0]) {
			t.Fatalf("result header %s = %q, want %q", k, got.Header[k], v)
		}
	}
}

// Close stops the waiting duplicates at once: they are no executions to
// wait for.
func TestWaitStopsAtClose(t *testing.T) {
	store := idemmem.NewStore(nil)
	e := newEngine(t, store, nil)
	op := idem.Operation{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), WaitInFlight: time.Hour}
	release := hold(t, e, op, idem.Result{Status: 201})
	done := make(chan error, 1)
	go func() {
		_, err := e.Do(context.Background(), op, nil)
		done <- err
	}()
	waitFor(t, "the duplicate to wait", func() bool { return idem.WaitWaiters(e, "t", "k") == 1 })
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	select {
	case err := <-done:
		if !errors.Is(err, idem.ErrClosed) {
			t.Errorf("waiting duplicate at Close = %v, want idem.ErrClosed", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a duplicate still waits after Close")
	}
	release()
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}
