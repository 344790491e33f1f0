package idemhttp_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/atonce"
)

// realClockEnv is an env whose store reads the real clock: the waiters
// compare the end of a lease with it.
func realClockEnv(t *testing.T) *env {
	t.Helper()
	store := idemmem.NewStore(nil)
	engine, err := idem.NewEngine(store, &idem.Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	return &env{store: store, engine: engine}
}

// Twenty duplicates released together against a slow handler, with
// WaitInFlight longer than the handler: one runs, the others get its
// answer replayed, none gets 409.
func TestWaitInFlightReplays(t *testing.T) {
	const n = 20
	e := realClockEnv(t)
	var runs atomic.Int32
	h := e.handler(t, idemhttp.Config{WaitInFlight: 2 * time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		time.Sleep(500 * time.Millisecond)
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":1}`))
	}))
	answers := make([]*httptest.ResponseRecorder, n)
	atonce.Run(n, func(i int) {
		answers[i] = serve(h, request(http.MethodPost, "/orders", "same-key", "buy 1"))
	})
	fresh, replayed := 0, 0
	for i, w := range answers {
		wantEcho(t, w, "same-key")
		switch {
		case w.Code != http.StatusCreated || w.Body.String() != `{"id":1}` || w.Header().Get("Location") != "/orders/1":
			t.Errorf("answer %d: %d %s, want the handler's 201", i, w.Code, w.Body)
		case w.Header().Get(idemhttp.HeaderReplayed) == "true":
			replayed++
		default:
			fresh++
		}
	}
	if runs.Load() != 1 || fresh != 1 || replayed != n-1 {
		t.Fatalf("handler ran %d times, %d fresh answers, %d replays; want 1, 1, %d", runs.Load(), fresh, replayed, n-1)
	}
}

// A waiting request whose client goes away stops waiting at once, even
// though the middleware runs handlers on past a disconnect; it ran
// nothing, and says so.
func TestWaitInFlightClientGone(t *testing.T) {
	e := realClockEnv(t)
	running, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := e.handler(t, idemhttp.Config{WaitInFlight: time.Hour}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(running)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(h, request(http.MethodPost, "/orders", "k", "buy 1")) }()
	<-running

	ctx, cancel := context.WithCancel(context.Background())
	waiting := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		waiting <- serve(h, request(http.MethodPost, "/orders", "k", "buy 1").WithContext(ctx))
	}()
	time.Sleep(20 * time.Millisecond) // before or while it waits: either way it must return
	cancel()
	select {
	case w := <-waiting:
		wantProblem(t, w, http.StatusInternalServerError, "request-cancelled")
	case <-time.After(30 * time.Second):
		t.Fatal("a waiting request whose client went away still waits")
	}
	close(release)
	if w := <-first; w.Code != http.StatusCreated {
		t.Fatalf("first request: %d, want 201", w.Code)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}

// Past WaitInFlight the waiting request gets the 409 it gets without it.
func TestWaitInFlightDeadline(t *testing.T) {
	e := realClockEnv(t)
	running, release := make(chan struct{}), make(chan struct{})
	var runs atomic.Int32
	h := e.handler(t, idemhttp.Config{WaitInFlight: 50 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(running)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := make(chan *httptest.ResponseRecorder, 1)
	go func() { first <- serve(h, request(http.MethodPost, "/orders", "k", "buy 1")) }()
	<-running
	w := serve(h, request(http.MethodPost, "/orders", "k", "buy 1"))
	close(release)
	<-first
	wantProblem(t, w, http.StatusConflict, "in-flight")
	if w.Header().Get("Retry-After") == "" {
		t.Error("409 in-flight without Retry-After")
	}
}

func TestWaitInFlightNegative(t *testing.T) {
	e := realClockEnv(t)
	_, err := idemhttp.NewMiddleware(e.engine, &idemhttp.Config{SharedKeySpace: true, WaitInFlight: -time.Second})
	if err == nil {
		t.Fatal("NewMiddleware accepted a negative WaitInFlight")
	}
}
