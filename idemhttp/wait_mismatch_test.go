package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// heldReads is an idemmem store whose reads of a record (the waiters'
// poller's) wait until open is called; entered is closed at the first.
type heldReads struct {
	*idemmem.Store
	entered, gate chan struct{}
	once          sync.Once
}

func (s *heldReads) hold(ctx context.Context) error {
	s.once.Do(func() { close(s.entered) })
	select {
	case <-s.gate:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *heldReads) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	if err := s.hold(ctx); err != nil {
		return nil, err
	}
	return s.Store.Get(ctx, tenant, key)
}

func (s *heldReads) GetState(ctx context.Context, tenant, key string) (*idem.Record, error) {
	if err := s.hold(ctx); err != nil {
		return nil, err
	}
	return s.Store.GetState(ctx, tenant, key)
}

// A waiting duplicate whose first request is released (a 5xx with
// ReleaseOn5xx) and whose key another request claims before the waiter's
// first look gets the 422 a retry would get, not a wait to its limit and
// a 409.
func TestWaitInFlightLostToAnotherRequest(t *testing.T) {
	store := &heldReads{Store: idemmem.NewStore(nil), entered: make(chan struct{}), gate: make(chan struct{})}
	engine, err := idem.NewEngine(store, &idem.Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{engine: engine}
	releaseFirst, releaseOther := make(chan struct{}), make(chan struct{})
	running := make(chan string, 2)
	h := e.handler(t, idemhttp.Config{WaitInFlight: 20 * time.Second, ReleaseOn5xx: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 16)
		n, _ := r.Body.Read(buf)
		body := string(buf[:n])
		running <- body
		if body == "buy 1" {
			<-releaseFirst
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		<-releaseOther
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(h, request(http.MethodPost, "/orders", "k", "buy 1")) }()
	<-running
	waiter := make(chan *httptest.ResponseRecorder, 1)
	go func() { waiter <- serve(h, request(http.MethodPost, "/orders", "k", "buy 1")) }()
	<-store.entered
	close(releaseFirst)
	if w := <-first; w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first request: %d, want its 503", w.Code)
	}
	other := make(chan *httptest.ResponseRecorder, 1)
	go func() { other <- serve(h, request(http.MethodPost, "/orders", "k", "buy 2")) }()
	if body := <-running; body != "buy 2" {
		t.Fatalf("the handler ran for %q, want the other request", body)
	}
	close(store.gate)
	select {
	case w := <-waiter:
		wantProblem(t, w, http.StatusUnprocessableEntity, "fingerprint-mismatch")
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter still waits for a key another request holds")
	}
	close(releaseOther)
	if w := <-other; w.Code != http.StatusCreated {
		t.Fatalf("other request: %d, want 201", w.Code)
	}
}
