package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// waitFor polls cond until it holds or the test's patience runs out. It
// waits for background work (a heartbeat) without asserting how long it
// takes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestFencingSlowHandlerTakenOver: with the heartbeat off, a handler slower
// than its lease is taken over by a retry; when the slow one finishes, its
// completion is refused (409 lease-lost), and only the winner's result is
// stored and replayed.
func TestFencingSlowHandlerTakenOver(t *testing.T) {
	e := newEnv(t, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
	var runs atomic.Int64
	slowStarted := make(chan struct{})
	releaseSlow := make(chan struct{})
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(slowStarted)
			<-releaseSlow
			w.Header().Set("Location", "/orders/slow")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "slow")
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "winner")
	}))

	slow := make(chan *httptest.ResponseRecorder)
	go func() { slow <- serve(h, request(http.MethodPost, "/orders", "k1", "a")) }()
	<-slowStarted
	e.clock.Advance(300 * time.Millisecond) // past the 200ms lease

	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if w.Code != http.StatusCreated || w.Body.String() != "winner" {
		t.Fatalf("retry: %d %q, want the takeover's 201", w.Code, w.Body)
	}
	close(releaseSlow)
	ws := <-slow
	wantProblem(t, ws, http.StatusConflict, "lease-lost")
	wantEcho(t, ws, "k1")
	if loc := ws.Header().Get("Location"); loc != "" {
		t.Fatalf("the refused answer's Location %q leaked into the problem", loc)
	}

	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateComplete || string(rec.Result.Body) != "winner" {
		t.Fatalf("stored %s %q, want the winner's result", rec.State, rec.Result.Body)
	}
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Body.String() != "winner" || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replay %q, want the winner's", w.Body)
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", runs.Load())
	}
}

// TestHeartbeatPreventsTakeover: with the heartbeat on, the same slow
// handler keeps its key: a retry past the original lease end meets it in
// flight.
func TestHeartbeatPreventsTakeover(t *testing.T) {
	const lease = 200 * time.Millisecond
	e := newEnv(t, &idem.Config{Lease: lease, Heartbeat: 5 * time.Millisecond})
	var runs atomic.Int64
	started := make(chan struct{})
	release := make(chan struct{})
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "slow but alive")
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(h, request(http.MethodPost, "/orders", "k1", "a")) }()
	<-started

	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	firstEnd := rec.LockedUntil
	e.clock.Advance(150 * time.Millisecond)
	// Wait for a beat on the moved clock: the lease now ends 200ms after
	// it, past its first end.
	waitFor(t, "a heartbeat", func() bool {
		rec, err := e.store.Get(t.Context(), testTenant, "k1")
		return err == nil && rec.LockedUntil.After(firstEnd)
	})
	e.clock.Advance(100 * time.Millisecond) // past the first end, within the extended one

	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	wantProblem(t, w, http.StatusConflict, "in-flight")
	close(release)
	if w := <-done; w.Code != http.StatusCreated || w.Body.String() != "slow but alive" {
		t.Fatalf("slow handler: %d %q, want its 201", w.Code, w.Body)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}
}

// TestLostLeaseCancelsHandler: the heartbeat that finds the lease taken
// over cancels the context of the request the handler sees, which proves
// the handler runs under the engine's context (the one that carries the
// store's transaction).
func TestLostLeaseCancelsHandler(t *testing.T) {
	e := newEnv(t, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: 5 * time.Millisecond})
	var runs atomic.Int64
	started := make(chan struct{})
	cause := make(chan error, 1)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			close(started)
			select {
			case <-r.Context().Done():
				cause <- context.Cause(r.Context())
			case <-time.After(10 * time.Second):
				cause <- errors.New("the handler's context never ended")
			}
			w.WriteHeader(http.StatusCreated)
			return
		}
		w.WriteHeader(http.StatusAccepted)
	}))
	slow := make(chan *httptest.ResponseRecorder)
	go func() { slow <- serve(h, request(http.MethodPost, "/orders", "k1", "a")) }()
	<-started

	// The live heartbeat keeps extending the lease from the store's
	// clock; jump the clock far and retry until a claim falls between
	// two beats and takes over.
	for i := 0; ; i++ {
		if i == 1000 {
			t.Fatal("no takeover after 1000 jumps past the lease")
		}
		e.clock.Advance(time.Minute)
		w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
		if w.Code == http.StatusAccepted {
			break
		}
		wantProblem(t, w, http.StatusConflict, "in-flight")
	}
	if err := <-cause; err != idem.ErrLeaseLost {
		t.Fatalf("handler context ended with %v, want idem.ErrLeaseLost", err)
	}
	wantProblem(t, <-slow, http.StatusConflict, "lease-lost")
}
