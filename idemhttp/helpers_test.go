package idemhttp_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
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

// testTenant is the tenant of the requests built by request: the caller
// its Authorization header authenticates.
const testTenant = "acme"

// tenantOf stands for what an authentication middleware in front leaves
// for TenantFunc: here the tenant is the bearer token itself.
func tenantOf(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return "", errors.New("not authenticated")
	}
	return token, nil
}

// as makes r a request of tenant.
func as(tenant string, r *http.Request) *http.Request {
	r.Header.Set("Authorization", "Bearer "+tenant)
	return r
}

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

// request builds a request of testTenant; key "" means no
// Idempotency-Key field.
func request(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	return as(testTenant, r)
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
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

// problemBody is the decoded RFC 9457 answer.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// wantProblem checks that w is the problem slug with status.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, slug string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != idemhttp.ContentTypeProblem {
		t.Fatalf("Content-Type = %q, want %q", ct, idemhttp.ContentTypeProblem)
	}
	var p problemBody
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if want := idemhttp.ProblemTypeBase + slug; p.Type != want {
		t.Fatalf("problem type = %q, want %q", p.Type, want)
	}
	if p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem = %+v, want status %d with title and detail", p, status)
	}
}

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
