package idemredis

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/httpcheck"
	"github.com/idem-go/idem/internal/testenv"
)

// TestHTTPSameKeyAtTheSameInstant: two HTTP servers (two app instances,
// each with its own Redis client) share one prefix; 50 identical POSTs
// with one key, released by one barrier and spread over both, run the
// handler exactly once. Every other answer is the byte-identical replay
// or a 409 in flight, and a retry after the completion gets the replay
// (httpcheck.SameKeyAtTheSameInstant).
func TestHTTPSameKeyAtTheSameInstant(t *testing.T) {
	prefix := testenv.Name()
	httpcheck.SameKeyAtTheSameInstant(t, 50, func(t testing.TB) *idem.Engine {
		engine, err := idem.NewEngine(newStoreOn(t, newClient(t, -1), prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		return engine
	})
}

// TestHTTPUnreachableFailsClosed: with Redis unreachable, a request with a
// key is answered 503 and the handler does not run.
func TestHTTPUnreachableFailsClosed(t *testing.T) {
	store, err := NewStore(unreachableClient(t), &Config{Logger: (&logBuffer{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: (&logBuffer{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("42"))
	req.Header.Set(idemhttp.HeaderKey, "order-42")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || runs.Load() != 0 {
		t.Fatalf("answer %d after %d runs, want 503 and no run", rec.Code, runs.Load())
	}
}
