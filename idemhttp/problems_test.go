package idemhttp_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// detail returns the detail of the problem w answered.
func detail(t *testing.T, w *httptest.ResponseRecorder) string {
	t.Helper()
	var p problemBody
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	return p.Detail
}

// The problems that tell what became of the work say what is true for the
// store: here one without transactions; tests/idemhttp runs the same
// check on SQLite and PostgreSQL.
func TestProblemTextsFollowTheStore(t *testing.T) {
	idemhttptest.CheckProblemTexts(t, func(t *testing.T) idem.Store { return newEnv(t, nil).store })
}

// Lease lost on a store without transactions: the slow execution's work
// stands, and the problem says so.
func TestLeaseLostTextWithoutTransactions(t *testing.T) {
	e := newEnv(t, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
	started, release := make(chan struct{}), make(chan struct{})
	first := true
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first {
			first = false
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
	}))
	slow := make(chan *httptest.ResponseRecorder)
	go func() { slow <- serve(h, request(http.MethodPost, "/orders", "k1", "a")) }()
	<-started
	e.clock.Advance(time.Second)
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code != http.StatusCreated {
		t.Fatalf("takeover: %d", w.Code)
	}
	close(release)
	w := <-slow
	wantProblem(t, w, http.StatusConflict, "lease-lost")
	if d := detail(t, w); strings.Contains(d, "rolled back") || !strings.Contains(d, "stands") {
		t.Fatalf("detail %q: want it to say the work stands", d)
	}
}
