package idemhttp_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/httpcheck"
)

// clock is a store clock that tests move forward without sleeping.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// quietLogger drops the middleware's logs: the tests provoke failures on
// purpose.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// The requests of the tests, and their tenant (see httpcheck).
const testTenant = httpcheck.TestTenant

var (
	tenantOf = httpcheck.TenantOf
	as       = httpcheck.As
	request  = httpcheck.Request
	serve    = httpcheck.Serve
)

// env is a middleware over a fresh memory store.
type env struct {
	store  *idemmem.Store
	engine *idem.Engine
	clock  *clock
}

func newEnv(t testing.TB, ec *idem.Config) *env {
	t.Helper()
	c := newClock()
	store := idemmem.NewStore(&idemmem.Config{NowFunc: c.Now})
	if ec == nil {
		ec = &idem.Config{}
	}
	if ec.Logger == nil {
		ec.Logger = quietLogger
	}
	engine, err := idem.NewEngine(store, ec)
	if err != nil {
		t.Fatal(err)
	}
	return &env{store: store, engine: engine, clock: c}
}

// handler wraps next in a middleware configured by cfg (its Engine set
// to the env's, its TenantFunc to tenantOf unless the key space is shared).
func (e *env) handler(t testing.TB, cfg idemhttp.Config, next http.Handler) http.Handler {
	t.Helper()
	if cfg.TenantFunc == nil && !cfg.SharedKeySpace {
		cfg.TenantFunc = tenantOf
	}
	if cfg.Logger == nil {
		cfg.Logger = quietLogger
	}
	m, err := idemhttp.NewMiddleware(e.engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Handler(next)
}

// counting is a handler that counts its executions and answers 201 with a
// body naming the execution, a Location, a cookie and a custom header.
type counting struct {
	n atomic.Int64
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.n.Add(1)
	body, _ := io.ReadAll(r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/"+itoa(n))
	h.Set("Set-Cookie", "session=secret")
	h.Set("X-Custom", "not-allowlisted")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"execution":`+itoa(n)+`,"request":`+quote(string(body))+`}`)
}

func itoa(n int64) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func quote(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// problemBody is the decoded RFC 9457 answer; wantProblem checks that an
// answer is the problem slug with status.
type problemBody = httpcheck.Problem

var wantProblem = httpcheck.WantProblem

// wantEcho checks that the response echoes the request's key.
func wantEcho(t *testing.T, w *httptest.ResponseRecorder, key string) {
	t.Helper()
	if got := w.Header().Values(idemhttp.HeaderKey); len(got) != 1 || got[0] != key {
		t.Fatalf("%s echoed %q, want %q", idemhttp.HeaderKey, got, key)
	}
}

// wantAbsent checks that the store holds no record for (tenant, key).
func (e *env) wantState(t *testing.T, tenant, key string, want idem.State) {
	t.Helper()
	rec, err := e.store.Get(t.Context(), tenant, key)
	if err != nil || rec.State != want {
		t.Fatalf("record for %q/%q: %+v, %v; want %s", tenant, key, rec, err, want)
	}
}

func (e *env) wantAbsent(t *testing.T, tenant, key string) {
	t.Helper()
	if rec, err := e.store.Get(t.Context(), tenant, key); err == nil {
		t.Fatalf("record for %q/%q exists (state %s), want none", tenant, key, rec.State)
	}
}
