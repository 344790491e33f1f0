package idemhttp_test

import (
	"bytes"
	"database/sql"
	"io"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// sqliteEnv is the middleware over idemsql on a SQLite file, with an
// orders table for the handlers' business writes.
type sqliteEnv struct {
	db     *sql.DB
	store  *idemsql.Store
	engine *idem.Engine
}

func newSQLiteEnv(t *testing.T) *sqliteEnv {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(t.Context(), db, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, item TEXT NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	store := testenv.Must(idemsql.NewStore(db, idemsql.SQLite))
	engine, err := idem.NewEngine(store, &idem.Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	return &sqliteEnv{db: db, store: store, engine: engine}
}

func (e *sqliteEnv) handler(t *testing.T, cfg idemhttp.Config, next http.Handler) http.Handler {
	t.Helper()
	cfg.Logger = quietLogger
	if cfg.TenantFunc == nil && !cfg.SharedKeySpace {
		cfg.TenantFunc = tenantOf
	}
	m, err := idemhttp.NewMiddleware(e.engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m.Handler(next)
}

func (e *sqliteEnv) orders(t *testing.T) int {
	t.Helper()
	var n int
	if err := e.db.QueryRowContext(t.Context(), `SELECT count(*) FROM orders`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// insertOrder writes an order in the request's transaction, as a real
// handler does, and fails the test when the request carries none.
func insertOrder(t *testing.T, r *http.Request) int64 {
	tx := idemsql.TxFromContext(r.Context())
	if tx == nil {
		t.Error("the handler's request carries no idemsql transaction")
		panic(http.ErrAbortHandler)
	}
	body, _ := io.ReadAll(r.Body)
	res, err := tx.ExecContext(r.Context(), `INSERT INTO orders (item) VALUES (?)`, string(body))
	if err != nil {
		t.Errorf("insert: %v", err)
		panic(http.ErrAbortHandler)
	}
	id, _ := res.LastInsertId()
	return id
}

// A 5xx is stored and replayed, but the order it wrote is rolled back.
func TestSQLite5xxRollsBackWrites(t *testing.T) {
	e := newSQLiteEnv(t)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		insertOrder(t, r)
		http.Error(w, "card declined by a broken provider", http.StatusBadGateway)
	}))
	first := serve(h, request(http.MethodPost, "/orders", "k1", "tea"))
	second := serve(h, request(http.MethodPost, "/orders", "k1", "tea"))
	if first.Code != http.StatusBadGateway || second.Code != http.StatusBadGateway || second.Header().Get(idemhttp.HeaderReplayed) != "true" || !bytes.Equal(first.Body.Bytes(), second.Body.Bytes()) {
		t.Fatalf("got %d then %d %q (replayed %q)", first.Code, second.Code, second.Body, second.Header().Get(idemhttp.HeaderReplayed))
	}
	if runs.Load() != 1 || e.orders(t) != 0 {
		t.Fatalf("ran %d times leaving %d orders; want 1 and 0", runs.Load(), e.orders(t))
	}
}

// A database that cannot be reached: 503, and the handler does not run.
func TestSQLiteStoreUnavailable(t *testing.T) {
	e := newSQLiteEnv(t)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	e.db.Close()
	w := serve(h, request(http.MethodPost, "/orders", "k1", "tea"))
	wantProblem(t, w, http.StatusServiceUnavailable, "store-unavailable")
	if runs.Load() != 0 {
		t.Fatalf("handler ran %d times with the database closed", runs.Load())
	}
}

// A handler that puts a control character in a replayed header (a bug of
// its own) still gets its answer stored, the character as a space, as
// net/http sends CR and LF: refusing the answer would undo the order for
// the retry to make it again.
func TestSQLiteControlCharacterInStoredHeader(t *testing.T) {
	e := newSQLiteEnv(t)
	runs := 0
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs++
		insertOrder(t, r)
		w.Header().Set("Location", "/orders/1\r\nX-Evil: 1")
		w.WriteHeader(http.StatusCreated)
	}))
	first := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	again := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if first.Code != http.StatusCreated || again.Code != http.StatusCreated || again.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("first %d, retry %d (replayed %q); want 201 and its replay", first.Code, again.Code, again.Header().Get(idemhttp.HeaderReplayed))
	}
	if loc := again.Header().Get("Location"); loc != "/orders/1  X-Evil: 1" {
		t.Fatalf("replayed Location %q", loc)
	}
	if runs != 1 || e.orders(t) != 1 {
		t.Fatalf("%d runs, %d orders; want 1 and 1", runs, e.orders(t))
	}
}
