package idemclient_test

// The Transport against idemhttp servers: lost answers, slow and crashed
// executions, redirects between nodes that share one store. Each test
// counts the handler's executions on the server side.

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

// customers is a Stripe-shaped POST /v1/customers (form-encoded) that
// counts its executions.
type customers struct {
	executions atomic.Int32
	// gate, when set, is waited for before answering: a slow handler.
	gate chan struct{}
}

func (c *customers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	n := c.executions.Add(1)
	if c.gate != nil {
		// Slow on purpose, and deaf to the request's end: the work goes on
		// after the client gave the attempt up.
		<-c.gate
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("cus_%d", n), "object": "customer",
		"email": r.PostForm.Get("email"), "name": r.PostForm.Get("name"),
	})
}

// attempts records what reached the server (outside idemhttp): the key of
// each request and the status the middleware answered.
type attempts struct {
	loseFirst bool // drop the first response after the commit
	mu        sync.Mutex
	keys      []string
	statuses  []int
	onStatus  func(int)
}

func (a *attempts) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		a.mu.Lock()
		a.keys = append(a.keys, r.Header.Get(idemhttp.HeaderKey))
		a.statuses = append(a.statuses, rec.Code)
		onStatus := a.onStatus
		first := len(a.keys) == 1
		a.mu.Unlock()
		if onStatus != nil {
			onStatus(rec.Code)
		}
		if first && a.loseFirst && lose(w) {
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

func (a *attempts) snapshot() ([]string, []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...), append([]int(nil), a.statuses...)
}

// lose drops the connection instead of answering: the handler ran and
// idemhttp committed, but the client never hears of it.
func lose(w http.ResponseWriter) bool {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// lostFirstResponse serves h behind idemhttp over idemmem; the first
// response is lost after the commit.
func lostFirstResponse(t *testing.T, h http.Handler) (*httptest.Server, *attempts) {
	t.Helper()
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &attempts{loseFirst: true}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/customers", m.Handler(h))
	srv := httptest.NewServer(a.wrap(mux))
	t.Cleanup(srv.Close)
	return srv, a
}

// checkOneExecution asserts the scenario's outcome from the server side.
func checkOneExecution(t *testing.T, c *customers, a *attempts, wantAttempts int) {
	t.Helper()
	if n := c.executions.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	keys, statuses := a.snapshot()
	if len(keys) != wantAttempts {
		t.Fatalf("%d requests reached the server (statuses %v), want %d", len(keys), statuses, wantAttempts)
	}
	for i, k := range keys {
		if k == "" || k != keys[0] {
			t.Fatalf("request %d carried key %q; all must carry the first one, %q", i+1, k, keys[0])
		}
	}
}

// TestInFlightOutlivesACrashedHolder: the first attempt reaches a server
// that charges the card and then dies (its connection drops, its execution
// never ends). Every retry meets the dead execution's claim, 409, until its
// lease ends on the store's clock; then a retry takes the key over and
// gets an answer. With the server's default lease (90s), the client must
// keep asking longer than its attempt budget for failures lasts: 409s are
// bounded by InFlightTimeout (2 minutes by default), not by MaxAttempts.
//
