// Package stripeserver is a test harness, not library code: a
// Stripe-shaped API behind idemhttp whose first answer can be lost after
// the commit, for the tests of retrying clients (idemclient's own, and the
// third-party clients' in the tests module). Each test counts the
// handler's executions on the server side.
package stripeserver

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// Customers is a Stripe-shaped POST /v1/customers (form-encoded) that
// counts its executions.
type Customers struct {
	Executions atomic.Int32
	// Gate, when set, is waited for before answering: a slow handler.
	Gate chan struct{}
}

func (c *Customers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	n := c.Executions.Add(1)
	if c.Gate != nil {
		// Slow on purpose, and deaf to the request's end: the work goes on
		// after the client gave the attempt up.
		<-c.Gate
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("cus_%d", n), "object": "customer",
		"email": r.PostForm.Get("email"), "name": r.PostForm.Get("name"),
	})
}

// Attempts records what reached the server (outside idemhttp): the key of
// each request and the status the middleware answered.
type Attempts struct {
	LoseFirst bool      // drop the first response after the commit
	OnStatus  func(int) // called with each status, when set
	mu        sync.Mutex
	keys      []string
	statuses  []int
}

// Wrap records the attempts that reach h.
func (a *Attempts) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		a.mu.Lock()
		a.keys = append(a.keys, r.Header.Get(idemhttp.HeaderKey))
		a.statuses = append(a.statuses, rec.Code)
		onStatus := a.OnStatus
		first := len(a.keys) == 1
		a.mu.Unlock()
		if onStatus != nil {
			onStatus(rec.Code)
		}
		if first && a.LoseFirst && Lose(w) {
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// Snapshot returns the keys and statuses recorded so far.
func (a *Attempts) Snapshot() ([]string, []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...), append([]int(nil), a.statuses...)
}

// Lose drops the connection instead of answering: the handler ran and
// idemhttp committed, but the client never hears of it.
func Lose(w http.ResponseWriter) bool {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// LostFirstResponse serves h at POST /v1/customers behind idemhttp over
// idemmem; the first response is lost after the commit.
func LostFirstResponse(t *testing.T, h http.Handler) (*httptest.Server, *Attempts) {
	t.Helper()
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &Attempts{LoseFirst: true}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/customers", m.Handler(h))
	srv := httptest.NewServer(a.Wrap(mux))
	t.Cleanup(srv.Close)
	return srv, a
}

// CheckOneExecution fails t unless c ran once and wantAttempts requests,
// all under one key, reached the server.
func CheckOneExecution(t *testing.T, c *Customers, a *Attempts, wantAttempts int) {
	t.Helper()
	if n := c.Executions.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	keys, statuses := a.Snapshot()
	if len(keys) != wantAttempts {
		t.Fatalf("%d requests reached the server (statuses %v), want %d", len(keys), statuses, wantAttempts)
	}
	for i, k := range keys {
		if k == "" || k != keys[0] {
			t.Fatalf("request %d carried key %q; all must carry the first one, %q", i+1, k, keys[0])
		}
	}
}
