package idemhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// disconnecting serves h over a real connection, sends one keyed POST,
// and hangs up once the handler has started; it returns when the server
// has seen the client go (the request's own context ended).
func disconnecting(t *testing.T, h http.Handler, started <-chan struct{}) {
	t.Helper()
	gone := make(chan struct{})
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		context.AfterFunc(r.Context(), func() { close(gone) })
		h.ServeHTTP(w, r)
	}))
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders", strings.NewReader("tea"))
	as(testTenant, req)
	req.Header.Set(idemhttp.HeaderKey, "k1")
	errc := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-started
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the client's request: %v, want it cancelled", err)
	}
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		t.Fatal("the server never saw the client go")
	}
}

// By default the handler of a client that hung up runs on: its context is
// not cancelled, its answer is stored, and the retry gets it.
func TestDisconnectedClientRetryGetsTheAnswer(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	finished := make(chan error, 1)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		// A payment provider called with this context would see it
		// cancelled, and the retry would charge again.
		finished <- r.Context().Err()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged once")
	}))
	disconnecting(t, h, started)
	close(release)
	if err := <-finished; err != nil {
		t.Fatalf("the handler's context ended with its client: %v", err)
	}
	w := retryWhileInFlight(t, h, func() *http.Request { return request(http.MethodPost, "/orders", "k1", "tea") })
	if w.Code != http.StatusCreated || w.Body.String() != "charged once" || w.Header().Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 1 {
		t.Fatalf("retry: %d %q replayed=%q, ran %d times; want the stored answer", w.Code, w.Body, w.Header().Get(idemhttp.HeaderReplayed), runs.Load())
	}
}

// ShutdownContext ends the handlers that run on after their client left.
func TestShutdownContextEndsDetachedHandlers(t *testing.T) {
	e := newEnv(t, nil)
	shutdown, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	errStopping := errors.New("server stopping")
	started, giveUp := make(chan struct{}), make(chan struct{})
	ended := make(chan error, 1)
	h := e.handler(t, idemhttp.Config{ShutdownContext: shutdown}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			ended <- context.Cause(r.Context())
		case <-giveUp: // the test failed: let the server close
		}
	}))
	disconnecting(t, h, started)
	t.Cleanup(func() { close(giveUp) }) // before the server's Close, which waits for the handler
	select {
	case err := <-ended:
		t.Fatalf("the handler's context ended with its client (%v), before the shutdown", err)
	default:
	}
	stop(errStopping)
	select {
	case err := <-ended:
		if !errors.Is(err, errStopping) {
			t.Fatalf("the handler's context ended with %v, want the shutdown's cause", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the shutdown did not end the handler's context")
	}
}
