package idemhttp_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// completeFails is a store whose completions fail, as when the store
// goes away while the handler runs.
type completeFails struct{ idem.Store }

func (s completeFails) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	u, err := s.Store.Begin(ctx)
	return failingUnit{u}, err
}

type failingUnit struct{ idem.UnitOfWork }

func (u failingUnit) Complete(ctx context.Context, _ idem.CompleteParams) error {
	u.UnitOfWork.Rollback(ctx)
	return errors.New("connection lost")
}

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
// store in use: rolled back on a transactional one; standing, with the key
// kept until its lease ends, on one without transactions.
func TestProblemTextsFollowTheStore(t *testing.T) {
	type failure struct {
		slug   string
		status int
		config idemhttp.Config
		fail   func(w http.ResponseWriter, r *http.Request, cancel func())
	}
	failures := []failure{
		{"handler-panic", 500, idemhttp.Config{}, func(http.ResponseWriter, *http.Request, func()) { panic("boom") }},
		{"request-cancelled", 500, idemhttp.Config{CancelOnDisconnect: true}, func(w http.ResponseWriter, _ *http.Request, cancel func()) {
			cancel()
			w.WriteHeader(http.StatusCreated)
		}},
		{"store-unavailable", 503, idemhttp.Config{}, func(w http.ResponseWriter, _ *http.Request, _ func()) { w.WriteHeader(http.StatusCreated) }},
		{"response-too-large", 500, idemhttp.Config{MaxResponseBody: 10}, func(w http.ResponseWriter, _ *http.Request, _ func()) {
			io.WriteString(w, "more than ten bytes")
		}},
	}
	stores := []struct {
		name          string
		transactional bool
		store         func(t *testing.T) idem.Store
	}{
		{"memory", false, func(t *testing.T) idem.Store { return newEnv(t, nil).store }},
		// The transactional stores run this test in the tests module.
	}
	for _, st := range stores {
		for _, f := range failures {
			t.Run(st.name+"/"+f.slug, func(t *testing.T) {
				store := st.store(t)
				if f.slug == "store-unavailable" {
					store = completeFails{store}
				}
				engine, err := idem.NewEngine(store, &idem.Config{Logger: quietLogger})
				if err != nil {
					t.Fatal(err)
				}
				cfg := f.config
				cfg.TenantFunc, cfg.Logger = tenantOf, quietLogger
				m, err := idemhttp.NewMiddleware(engine, &cfg)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { f.fail(w, r, cancel) }))
				w := serve(h, request(http.MethodPost, "/orders", "k1", "a").WithContext(ctx))
				wantProblem(t, w, f.status, f.slug)
				d := detail(t, w)
				if st.transactional {
					if !strings.Contains(d, "rolled back") || strings.Contains(d, "cannot roll") {
						t.Fatalf("detail %q: want it to say the work was rolled back", d)
					}
				} else {
					if strings.Contains(d, "rolled back") || !strings.Contains(d, "cannot roll work back") {
						t.Fatalf("detail %q: want it to say the work stands", d)
					}
				}
			})
		}
	}
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
