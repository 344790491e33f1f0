package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// With CancelOnDisconnect, a client that hangs up cancels its handler; on
// a transactional store its writes roll back and the key is released, so
// the retry runs again.
func TestCancelOnDisconnectSQLite(t *testing.T) {
	e := newSQLiteEnv(t)
	var runs atomic.Int64
	started := make(chan struct{})
	finished := make(chan error, 1)
	h := e.handler(t, idemhttp.Config{CancelOnDisconnect: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		insertOrder(t, r)
		if runs.Add(1) == 1 {
			close(started)
			<-r.Context().Done()
			finished <- r.Context().Err()
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	disconnecting(t, h, started)
	if err := <-finished; !errors.Is(err, context.Canceled) {
		t.Fatalf("handler context: %v, want cancelled", err)
	}
	w := retryWhileInFlight(t, h, func() *http.Request { return request(http.MethodPost, "/orders", "k1", "tea") })
	if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "" || runs.Load() != 2 || e.orders(t) != 1 {
		t.Fatalf("retry: %d replayed=%q, ran %d times, %d orders; want a fresh run and 1 order", w.Code, w.Header().Get(idemhttp.HeaderReplayed), runs.Load(), e.orders(t))
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil || rec.State != idem.StateComplete {
		t.Fatalf("record %+v, %v", rec, err)
	}
}

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

// newServer serves h on a real connection, for what only a real server
// shows (a connection closed after a short body).
func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}
