package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Routes of the server, one per implementation under test. The replay
// scenario uses routeIdem with keys that have already completed.
const (
	routeBare  = "/bare/orders"
	routeIdem  = "/idem/orders"
	routeNaive = "/naive/orders"
	// routeVariant is routeIdem on a second schema changed by -variant.
	routeVariant = "/variant/orders"
	// routeOneTx claims inside the business transaction: not idem's
	// design, measured with -onetx for comparison.
	routeOneTx = "/onetx/orders"
)

// tenant is the owner of every order: in a real service it comes from
// authentication; a constant keeps the routes comparable.
const tenant = "t1"

// schemaSQL is the business table the four routes write, and the table of
// the naive implementation. orders has no unique index on idem_key on
// purpose: the naive route relies on its lookup alone, and the duplicate
// count shows what that lookup lets through.
const schemaSQL = `
CREATE TABLE orders (
	id          bigserial PRIMARY KEY,
	tenant_id   text NOT NULL,
	cart_id     text NOT NULL,
	total_cents bigint NOT NULL,
	idem_key    text,
	created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE naive_keys (
	idem_key text PRIMARY KEY,
	status   int NOT NULL,
	body     bytea NOT NULL
);`

// countingConn counts the writes and reads pgx makes on a database
// connection. pgx buffers a query, or a whole pipeline, and writes it at
// once, so writes per request is the number of round trips a request
// costs. Reads count the wake-ups waiting for answers: a pipeline whose
// answer the server sends in pieces costs several.
type countingConn struct {
	net.Conn
	writes, reads *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func (c countingConn) Read(p []byte) (int, error) {
	c.reads.Add(1)
	return c.Conn.Read(p)
}

// latencyConn simulates a network between the application and PostgreSQL
// (-rtt): what the server sends is handed to pgx no sooner than rtt after
// pgx's latest write, the request that caused it. Loopback has next to no
// latency, so without it every round trip costs only CPU; with it, a round
// trip costs what it costs across a real link, and the waiting is a sleep,
// not CPU.
type latencyConn struct {
	net.Conn
	rtt time.Duration

	mu        sync.Mutex
	lastWrite time.Time
}

func (c *latencyConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.lastWrite = time.Now()
	c.mu.Unlock()
	return c.Conn.Write(p)
}

func (c *latencyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	due := c.lastWrite.Add(c.rtt)
	c.mu.Unlock()
	if d := time.Until(due); d > 0 {
		time.Sleep(d)
	}
	return n, err
}

// database is the fresh schema a run works in, and the pool on it.
type database struct {
	base   string
	schema string
	pool   *pgxpool.Pool
	writes atomic.Int64 // writes to PostgreSQL, see countingConn; statements run on database/sql
	reads  atomic.Int64 // reads from PostgreSQL; statements prepared on database/sql

	// With -store mysql or sqlite (see sqlstore.go): the database/sql
	// handle instead of pool, its idemsql dialect, and how to remove the
	// database.
	store   string
	sql     *sql.DB
	dialect idemsql.Dialect
	dropSQL func()

	mu   sync.Mutex
	pids []uint32 // the backends of the pool, whose CPU time is measured
}

// backends returns the process ids of the pool's backends.
func (db *database) backends() []uint32 {
	db.mu.Lock()
	defer db.mu.Unlock()
	return slices.Clone(db.pids)
}

// openDatabase creates a schema of its own, so that a run never meets the
// tables of another (or of the tests sharing the server), and opens a
// pool whose connections use it.
//
// extraSQL, when not empty, runs after the migrations: the variant of the
// schema a second database is there to measure.
//
// rtt, when positive, puts a simulated network of that round-trip time
// between the pool and the server (latencyConn).
func openDatabase(ctx context.Context, url string, conns int, extraSQL string, rtt time.Duration) (*database, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := &database{base: url, schema: "loadbench_" + hex.EncodeToString(b[:])}

	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+db.schema); err != nil {
		return nil, err
	}

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		db.drop()
		return nil, err
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns) // no connection set-up inside a measurement
	cfg.ConnConfig.RuntimeParams["search_path"] = db.schema
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		if rtt > 0 {
			c = &latencyConn{Conn: c, rtt: rtt}
		}
		return countingConn{Conn: c, writes: &db.writes, reads: &db.reads}, nil
	}
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		db.mu.Lock()
		db.pids = append(db.pids, c.PgConn().PID())
		db.mu.Unlock()
		return nil
	}
	db.pool, err = pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		db.drop()
		return nil, err
	}
	if _, err := db.pool.Exec(ctx, schemaSQL); err != nil {
		db.close()
		return nil, err
	}
	if err := idempg.Migrate(ctx, db.pool); err != nil {
		db.close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := db.pool.Exec(ctx, oneTxSQL+";"+realisticSQL+";"+peerSQL); err != nil {
		db.close()
		return nil, err
	}
	if extraSQL != "" {
		if _, err := db.pool.Exec(ctx, extraSQL); err != nil {
			db.close()
			return nil, fmt.Errorf("variant: %w", err)
		}
	}
	return db, nil
}

// close drops the schema: a benchmark leaves nothing behind.
func (db *database) close() {
	if db.pool != nil {
		db.pool.Close()
	}
	if db.sql != nil {
		db.sql.Close()
	}
	db.drop()
}

func (db *database) drop() {
	if db.dropSQL != nil {
		db.dropSQL()
		return
	}
	// A fresh context: the run's own may be the one that was cancelled.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, db.base)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "DROP SCHEMA "+db.schema+" CASCADE")
}

// orderRequest is the body the clients send.
type orderRequest struct {
	CartID     string `json:"cart_id"`
	TotalCents int64  `json:"total_cents"`
}

// order is the created resource, answered as JSON.
type order struct {
	ID         int64  `json:"id"`
	TenantID   string `json:"tenant_id"`
	CartID     string `json:"cart_id"`
	TotalCents int64  `json:"total_cents"`
	CreatedAt  string `json:"created_at"`
}

// querier is what the business handler needs of its transaction.
type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// txFunc runs fn in a transaction; each route gives its own.
type txFunc func(ctx context.Context, fn func(querier) error) error

const insertOrder = `INSERT INTO orders (tenant_id, cart_id, total_cents, idem_key)
VALUES ($1, $2, $3, $4) RETURNING id, to_char(created_at, 'YYYY-MM-DD"T"HH24:MI:SS.USOF')`

// createOrder is the business handler shared by every route, so that the
// routes differ only by what surrounds it.
func createOrder(inTx txFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req orderRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		o := order{TenantID: tenant, CartID: req.CartID, TotalCents: req.TotalCents}
		key := r.Header.Get(idemhttp.HeaderKey)
		err := inTx(r.Context(), func(tx querier) error {
			return tx.QueryRow(r.Context(), insertOrder, tenant, req.CartID, req.TotalCents, key).
				Scan(&o.ID, &o.CreatedAt)
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		body, _ := json.Marshal(o)
		h := w.Header()
		h["Content-Type"] = []string{"application/json"}
		h["Location"] = []string{"/orders/" + strconv.FormatInt(o.ID, 10)}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}
}

// newMux builds the routes on db, and the variant route on variant when
// it is not nil.
func newMux(db, variant *database, config, variantConfig *idempg.Config) (*http.ServeMux, error) {
	if db.sql != nil {
		return newSQLMux(db)
	}
	pool := db.pool
	own := func(ctx context.Context, fn func(querier) error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return fn(tx) })
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+routeBare, createOrder(own))
	idemOrders, err := idemRoute(pool, config)
	if err != nil {
		return nil, err
	}
	mux.Handle("POST "+routeIdem, idemOrders)
	mux.Handle("POST "+routeNaive, naive(pool, createOrder(own)))
	mux.Handle("POST "+routeOneTx, oneTx(pool, createOrder(oneTxQuerier)))
	mux.Handle("POST "+routePeer, peer(pool, createOrder(peerQuerier)))
	if err := addSingleRoutes(mux, pool, config); err != nil {
		return nil, err
	}
	if variant != nil {
		h, err := idemRoute(variant.pool, variantConfig)
		if err != nil {
			return nil, err
		}
		mux.Handle("POST "+routeVariant, h)
	}
	return mux, nil
}

// idemRoute is createOrder behind idemhttp on idempg, with every default
// but the store's config, as a new user would write it.
func idemRoute(pool *pgxpool.Pool, config *idempg.Config) (http.Handler, error) {
	store, err := idempg.NewStore(pool, config)
	if err != nil {
		return nil, err
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		return nil, err
	}
	// Under idemhttp the transaction belongs to the engine: the handler
	// writes through it and never commits.
	engineTx := func(ctx context.Context, fn func(querier) error) error {
		return fn(idempg.TxFromContext(ctx))
	}
	return mw.Handler(createOrder(engineTx)), nil
}

// hotUpdates returns how many updates of idem_keys there were and how
// many of them were HOT (heap-only: no new index entries). Nearly every
// update is a completion, so this says how often the completion found
// room on its page.
func (db *database) hotUpdates(ctx context.Context) (updates, hot int64, err error) {
	if db.pool == nil {
		return 0, 0, errors.New("not PostgreSQL")
	}
	err = db.pool.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
		WHERE schemaname = $1 AND relname = 'idem_keys'`, db.schema).Scan(&updates, &hot)
	return updates, hot, err
}

// naive is the check-then-write implementation many services start with:
// look the key up; if absent, run the handler, then remember the key and
// its answer. Nothing stops two requests with one key from both missing
// the lookup and both running the handler; the naive_keys primary key
// only makes the second remember fail, after its order is written.
func naive(pool *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		var status int
		var body []byte
		err := pool.QueryRow(r.Context(), `SELECT status, body FROM naive_keys WHERE idem_key = $1`, key).
			Scan(&status, &body)
		switch {
		case err == nil:
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		case !errors.Is(err, pgx.ErrNoRows):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		rec := &recorder{header: http.Header{}}
		next.ServeHTTP(rec, r)
		if rec.status < 500 {
			_, _ = pool.Exec(r.Context(),
				`INSERT INTO naive_keys (idem_key, status, body) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
				key, rec.status, rec.body)
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
	})
}

// recorder buffers the naive route's answer so that it can be stored.
type recorder struct {
	header http.Header
	status int
	body   []byte
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.body = append(r.body, p...)
	return len(p), nil
}

// analyze gathers the statistics of every table of the run's schema
// (PostgreSQL only), which invalidates the plans cached on them.
func (db *database) analyze(ctx context.Context) error {
	if db.pool == nil {
		return nil
	}
	rows, err := db.pool.Query(ctx, `SELECT format('ANALYZE %I.%I', schemaname, tablename) FROM pg_tables WHERE schemaname = $1`, db.schema)
	if err != nil {
		return err
	}
	stmts, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	for _, q := range stmts {
		if _, err := db.pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
