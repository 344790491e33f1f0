package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgEnv is the middleware over idempg on a fresh PostgreSQL schema, with
// an orders table for the handlers' business writes. Leases run on the
// server's clock here, in real time.
type pgEnv struct {
	pool  *pgxpool.Pool
	store *idempg.Store
}

func newPGEnv(t *testing.T) *pgEnv {
	t.Helper()
	url := testenv.PostgresSchema(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4 // the server is shared with every other test run
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id bigserial PRIMARY KEY, item text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &pgEnv{pool: pool, store: testenv.Must(idempg.NewStore(pool, nil))}
}

func (e *pgEnv) handler(t *testing.T, ec idem.Config, next http.Handler) http.Handler {
	t.Helper()
	ec.Logger = quietLogger
	engine, err := idem.NewEngine(e.store, &ec)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOf, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	return m.Handler(next)
}

func (e *pgEnv) items(t *testing.T) []string {
	t.Helper()
	rows, err := e.pool.Query(t.Context(), `SELECT item FROM orders ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var items []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		items = append(items, s)
	}
	return items
}

func pgInsert(t *testing.T, r *http.Request, item string) {
	tx := idempg.TxFromContext(r.Context())
	if tx == nil {
		t.Error("the handler's request carries no idempg transaction")
		panic(http.ErrAbortHandler)
	}
	if _, err := tx.Exec(r.Context(), `INSERT INTO orders (item) VALUES ($1)`, item); err != nil {
		t.Errorf("insert: %v", err)
		panic(http.ErrAbortHandler)
	}
}

// TestPostgresFencing: with the heartbeat off, a handler slower than its
// 200ms lease is taken over by a retry. The slow one's completion is
// refused (409 lease-lost) and its order rolled back: the database holds
// the winner's order and result only.
func TestPostgresFencing(t *testing.T) {
	e := newPGEnv(t)
	var runs atomic.Int64
	slowStarted := make(chan struct{})
	releaseSlow := make(chan struct{})
	h := e.handler(t, idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			pgInsert(t, r, "slow")
			close(slowStarted)
			<-releaseSlow
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "slow")
			return
		}
		pgInsert(t, r, "winner")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "winner")
	}))

	slow := make(chan *httptest.ResponseRecorder)
	go func() { slow <- serve(h, request(http.MethodPost, "/orders", "k1", "a")) }()
	<-slowStarted
	// Retry as a client would until the lease has run out on the
	// server's clock and the retry takes the key over.
	w := retryWhileInFlight(t, h, func() *http.Request { return request(http.MethodPost, "/orders", "k1", "a") })
	if w.Code != http.StatusCreated || w.Body.String() != "winner" {
		t.Fatalf("retry: %d %q, want the takeover's 201", w.Code, w.Body)
	}
	close(releaseSlow)
	wantProblem(t, <-slow, http.StatusConflict, "lease-lost")

	if items := e.items(t); len(items) != 1 || items[0] != "winner" {
		t.Fatalf("orders %q, want the winner's only", items)
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateComplete || string(rec.Result.Body) != "winner" {
		t.Fatalf("stored %s %q, want the winner's result", rec.State, rec.Result.Body)
	}
}

// TestPostgresHeartbeat: the same slow handler with the heartbeat on
// keeps its key for several leases; every retry meanwhile gets 409.
func TestPostgresHeartbeat(t *testing.T) {
	const lease = time.Second
	e := newPGEnv(t)
	var runs atomic.Int64
	started := make(chan struct{})
	release := make(chan struct{})
	h := e.handler(t, idem.Config{Lease: lease, Heartbeat: 100 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		pgInsert(t, r, "slow")
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "slow but alive")
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(h, request(http.MethodPost, "/orders", "k1", "a")) }()
	<-started
	// Retry for twice the lease: without the heartbeat one of these
	// would take the key over.
	for end := time.Now().Add(2 * lease); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		wantProblem(t, serve(h, request(http.MethodPost, "/orders", "k1", "a")), http.StatusConflict, "in-flight")
	}
	close(release)
	if w := <-done; w.Code != http.StatusCreated || w.Body.String() != "slow but alive" {
		t.Fatalf("slow handler: %d %q", w.Code, w.Body)
	}
	if runs.Load() != 1 || len(e.items(t)) != 1 {
		t.Fatalf("ran %d times, orders %q; want 1 and 1", runs.Load(), e.items(t))
	}
}

// TestPostgresSuccessAfterAbort: a handler that swallows a failed SQL
// statement and answers 201 gets a 500 problem instead: the 201 is not
// sent, nothing is stored, and the retry runs the handler again.
func TestPostgresSuccessAfterAbort(t *testing.T) {
	e := newPGEnv(t)
	runs := 0
	h := e.handler(t, idem.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		pgInsert(t, r, "swallowed")
		_, _ = idempg.TxFromContext(r.Context()).Exec(r.Context(), `INSERT INTO orders (item) VALUES (NULL)`) // error swallowed
		w.WriteHeader(http.StatusCreated)
	}))
	for i := range 2 {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "swallowed")
		req.Header.Set("Authorization", "Bearer acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusInternalServerError || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/problem+json") {
			t.Fatalf("attempt %d: %d %q %s; want a 500 problem", i, rec.Code, rec.Header().Get("Content-Type"), rec.Body)
		}
	}
	if runs != 2 {
		t.Fatalf("the handler ran %d times, want 2", runs)
	}
	if items := e.items(t); len(items) != 0 {
		t.Fatalf("orders %v committed, want none", items)
	}
}
