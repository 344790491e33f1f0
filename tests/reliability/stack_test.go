package reliability

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, for the checks
)

var (
	soakFlag   = flag.Duration("reliability.soak", 0, "run the invariant workload for this long per store (0: the short run only)")
	mutantFlag = flag.String("reliability.mutant", "", "break one guarantee on purpose, to see the scenario guarding it fail: "+strings.Join(mutants, ", "))
)

// mutants are the guarantees a test run can break on purpose. Each one
// must make at least one scenario fail; docs/RELIABILITY.md lists which.
var mutants = []string{
	"claim-wins",     // the store reports a lost claim as won
	"fail-open",      // the store reports a failed claim as won
	"unfenced-write", // the handler writes its order outside the engine's transaction (PostgreSQL)
	"heartbeat-off",  // the heartbeat scenario runs without a heartbeat
	"skip-release",   // the store never releases a key
	"shared-tenant",  // every caller lands in one tenant
	"store-cookie",   // the stored answer keeps Set-Cookie
	"no-body-limit",  // the request-body limit is lifted
}

func mutant(name string) bool { return *mutantFlag == name }

func TestMain(m *testing.M) {
	flag.Parse()
	if *mutantFlag != "" && !contains(mutants, *mutantFlag) {
		fmt.Printf("unknown -reliability.mutant %q; known: %s\n", *mutantFlag, strings.Join(mutants, ", "))
		return
	}
	m.Run()
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// quiet drops the engine's and the middleware's logs: the scenarios
// provoke failures on purpose.
var quiet = slog.New(slog.DiscardHandler)

// order is one business write: the key is stored in the order row, so that
// every order can be traced back to the key that created it.
type order struct {
	Tenant, Key, Item string
}

// database is one shared database, and how to open a "process" on it: an
// independent connection pool with its own store.
type database struct {
	name string
	// open returns a new connection pool on the database. via, when not
	// empty, is the host:port to dial instead of the server (a Proxy).
	open func(t *testing.T, via string) *conn
	// check is the test's own handle, for the final checks; it never goes
	// through a proxy.
	check *sql.DB
	// terminate ends the server backends of every pool whose connections
	// are labelled app (PostgreSQL only).
	terminate func(ctx context.Context, app string) (int, error)
	// addr is the server's host:port (PostgreSQL only).
	addr string
}

// conn is one process's connection pool on a database.
type conn struct {
	app   string // application_name, so that terminate reaches only these
	store idem.Store
	// insertTx writes an order in the engine's transaction, as a real
	// handler does.
	insertTx func(ctx context.Context, o order) (int64, error)
	// insertDirect writes it on a connection of its own, committed at
	// once: the unfenced-write mutant. Nil on SQLite, where it would wait
	// for the write lock the handler's own transaction holds.
	insertDirect func(ctx context.Context, o order) (int64, error)
	pool         *pgxpool.Pool // PostgreSQL only
}

// ordersDDL has no unique index on (tenant, idem_key), on purpose: a
// second execution must show up as a second row, not be masked by a
// constraint error.
const (
	sqliteOrders   = `CREATE TABLE orders (id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, idem_key TEXT NOT NULL, item TEXT NOT NULL)`
	postgresOrders = `CREATE TABLE orders (id bigserial PRIMARY KEY, tenant text NOT NULL, idem_key text NOT NULL, item text NOT NULL)`
)

func newSQLite(t *testing.T) *database {
	t.Helper()
	path := filepath.Join(t.TempDir(), "idem.db")
	check, err := idemsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { check.Close() })
	if err := idemmigrate.Migrate(t.Context(), check, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	if _, err := check.ExecContext(t.Context(), sqliteOrders); err != nil {
		t.Fatal(err)
	}
	return &database{
		name:  "sqlite",
		check: check,
		open: func(t *testing.T, via string) *conn {
			db, err := idemsqlite.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			return &conn{
				store: testenv.Must(idemsql.NewStore(db, idemsql.SQLite)),
				insertTx: func(ctx context.Context, o order) (int64, error) {
					var id int64
					err := idemsql.TxFromContext(ctx).QueryRowContext(ctx,
						`INSERT INTO orders (tenant, idem_key, item) VALUES (?, ?, ?) RETURNING id`,
						o.Tenant, o.Key, o.Item).Scan(&id)
					return id, err
				},
			}
		},
	}
}

func newPostgres(t *testing.T) *database {
	t.Helper()
	url := testenv.PostgresSchema(t)
	check, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	check.SetMaxOpenConns(2) // the server is shared with every other test run
	t.Cleanup(func() { check.Close() })
	base, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	d := &database{
		name:  "postgres",
		check: check,
		addr:  net.JoinHostPort(base.ConnConfig.Host, strconv.Itoa(int(base.ConnConfig.Port))),
		terminate: func(ctx context.Context, app string) (int, error) {
			var n int
			err := check.QueryRowContext(ctx,
				`SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1) t`, app).Scan(&n)
			return n, err
		},
	}
	d.open = func(t *testing.T, via string) *conn {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		app := testenv.Name()
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.MaxConns = 4
		if via != "" {
			host, port, _ := net.SplitHostPort(via)
			p, _ := strconv.Atoi(port)
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(p)
			cfg.ConnConfig.Fallbacks = nil
			cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		}
		pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			testenv.Unavailable(t, "PostgreSQL", err)
		}
		t.Cleanup(pool.Close)
		// The unfenced-write mutant writes on a pool of its own: on the
		// engine's pool, handlers holding their transaction's connection
		// while waiting for a second one would exhaust it, and the mutant
		// would fail for the wrong reason.
		side := pool
		if mutant("unfenced-write") {
			if side, err = pgxpool.NewWithConfig(t.Context(), cfg); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(side.Close)
		}
		return &conn{
			app:   app,
			pool:  pool,
			store: testenv.Must(idempg.NewStore(pool, nil)),
			insertTx: func(ctx context.Context, o order) (int64, error) {
				var id int64
				err := idempg.TxFromContext(ctx).QueryRow(ctx,
					`INSERT INTO orders (tenant, idem_key, item) VALUES ($1, $2, $3) RETURNING id`,
					o.Tenant, o.Key, o.Item).Scan(&id)
				return id, err
			},
			insertDirect: func(ctx context.Context, o order) (int64, error) {
				var id int64
				err := side.QueryRow(ctx,
					`INSERT INTO orders (tenant, idem_key, item) VALUES ($1, $2, $3) RETURNING id`,
					o.Tenant, o.Key, o.Item).Scan(&id)
				return id, err
			},
		}
	}
	first := d.open(t, "")
	if err := idempg.Migrate(t.Context(), first.pool); err != nil {
		t.Fatal(err)
	}
	if _, err := check.ExecContext(t.Context(), postgresOrders); err != nil {
		t.Fatal(err)
	}
	return d
}

// eachDatabase runs f on SQLite and on PostgreSQL.
func eachDatabase(t *testing.T, f func(t *testing.T, db *database)) {
	t.Run("sqlite", func(t *testing.T) { f(t, newSQLite(t)) })
	t.Run("postgres", func(t *testing.T) { f(t, newPostgres(t)) })
}

// entries counts the handler's entries per (tenant, key), across every
// process of a scenario.
type entries struct {
	mu sync.Mutex
	n  map[[2]string]int
}

func newEntries() *entries { return &entries{n: make(map[[2]string]int)} }

func (e *entries) add(tenant, key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n[[2]string{tenant, key}]++
	return e.n[[2]string{tenant, key}]
}

func (e *entries) get(tenant, key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[[2]string{tenant, key}]
}

func (e *entries) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, v := range e.n {
		n += v
	}
	return n
}

// stackConfig configures one process of a scenario.
type stackConfig struct {
	engine idem.Config
	http   idemhttp.Config
	via    string   // dial the database through this proxy address
	shared *entries // handler entries, shared between processes; fresh when nil
	// hook, when set, runs after the order is written in the transaction;
	// it returns true when it has answered itself.
	hook func(w http.ResponseWriter, r *http.Request, o order, id int64) bool
}

// stack is one "process": its own connection pool, store, engine,
// middleware and HTTP server, over the shared database.
type stack struct {
	db      *database
	conn    *conn
	store   *countingStore
	entries *entries
	srv     *httptest.Server
	client  *http.Client
	hook    func(w http.ResponseWriter, r *http.Request, o order, id int64) bool
}

func newStack(t *testing.T, db *database, cfg stackConfig) *stack {
	t.Helper()
	c := db.open(t, cfg.via)
	s := &stack{db: db, conn: c, store: newCountingStore(c.store), entries: cfg.shared, hook: cfg.hook}
	if s.entries == nil {
		s.entries = newEntries()
	}
	ec := cfg.engine
	ec.Logger = quiet
	engine, err := idem.NewEngine(s.store, &ec)
	if err != nil {
		t.Fatal(err)
	}
	hc := cfg.http
	hc.Logger = quiet
	hc.TenantFunc = tenantOf
	if mutant("no-body-limit") {
		hc.MaxRequestBody = 1 << 30
	}
	m, err := idemhttp.NewMiddleware(engine, &hc)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", m.Handler(http.HandlerFunc(s.serveOrder)))
	s.srv = httptest.NewServer(mux)
	t.Cleanup(s.srv.Close)
	s.client = &http.Client{Timeout: 30 * time.Second}
	return s
}

// tenantOf stands for authentication: the tenant is what the server
// knows of the caller (here, a bearer token naming it), never a header
// picked freely per request.
func tenantOf(r *http.Request) (string, error) {
	if mutant("shared-tenant") {
		return "", nil
	}
	tenant, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tenant == "" {
		return "", errors.New("not authenticated")
	}
	return tenant, nil
}

// serveOrder is the business handler: it writes one order row, holding
// its tenant and key, in the store's transaction, and answers 201 with a
// body unique to this execution, so that a second execution can never
// pass for a replay.
func (s *stack) serveOrder(w http.ResponseWriter, r *http.Request) {
	tenant, _ := tenantOf(r)
	key, _ := idemhttp.ParseKey(r.Header)
	item, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o := order{Tenant: tenant, Key: key, Item: string(item)}
	s.entries.add(tenant, key)
	insert := s.conn.insertTx
	if mutant("unfenced-write") && s.conn.insertDirect != nil {
		insert = s.conn.insertDirect
	}
	id, err := insert(r.Context(), o)
	if err != nil {
		// The database failed under the handler (an outage). A problem
		// body like the middleware's own, so that clients see one shape.
		w.Header().Set("Content-Type", idemhttp.ContentTypeProblem)
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, `{"type":"https://example.test/problems/order-write-failed","title":"Order not written","status":503}`)
		return
	}
	if s.hook != nil && s.hook(w, r, o, id) {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", id))
	w.WriteHeader(http.StatusCreated)
	body, _ := json.Marshal(map[string]any{"id": id, "tenant": tenant, "key": key, "item": o.Item, "execution": nonce()})
	w.Write(body)
}

func nonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// answer is one HTTP response as the client saw it.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error // transport error: no response
}

func (a answer) replayed() bool { return a.header.Get(idemhttp.HeaderReplayed) == "true" }

// problem returns the slug of a problem+json answer from idemhttp, the
// full type of another problem, or "" when the answer is not a problem.
func (a answer) problem() string {
	if a.err != nil || a.header.Get("Content-Type") != idemhttp.ContentTypeProblem {
		return ""
	}
	var p struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(a.body, &p) != nil || p.Type == "" {
		return "unparsable problem"
	}
	if slug, ok := strings.CutPrefix(p.Type, idemhttp.ProblemTypeBase); ok {
		return slug
	}
	return p.Type
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	body := a.body
	if len(body) > 300 {
		body = append(body[:300:300], "…"...)
	}
	return fmt.Sprintf("%d %s %q", a.status, a.header.Get("Content-Type"), body)
}

// post sends one order request. key is sent as given (nil: no field; more
// than one: several fields).
func (s *stack) post(ctx context.Context, tenant string, keys []string, item string) answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/orders", strings.NewReader(item))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("Authorization", "Bearer "+tenant)
	if keys != nil {
		req.Header[idemhttp.HeaderKey] = keys
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: body, err: err}
}

// order posts with one key field.
func (s *stack) order(ctx context.Context, tenant, key, item string) answer {
	return s.post(ctx, tenant, []string{key}, item)
}

// countingStore wraps a real store: it counts claims won per (tenant,
// key), logs every operation (for the tenant scenario), and applies the
// store mutants.
type countingStore struct {
	idem.Store
	mu       sync.Mutex
	won      map[[2]string]int
	claiming int // claims started and not yet returned
	log      []storeOp
}

type storeOp struct {
	op, tenant, key string
	won             bool
}

func newCountingStore(s idem.Store) *countingStore {
	return &countingStore{Store: s, won: make(map[[2]string]int)}
}

func (c *countingStore) record(op storeOp) {
	c.mu.Lock()
	c.log = append(c.log, op)
	c.mu.Unlock()
}

func (c *countingStore) Claim(ctx context.Context, p idem.ClaimParams) (idem.ClaimResult, error) {
	c.mu.Lock()
	c.claiming++
	c.mu.Unlock()
	res, err := c.Store.Claim(ctx, p)
	c.mu.Lock()
	c.claiming--
	if err == nil && res.Won {
		c.won[[2]string{p.Tenant, p.Key}]++
	}
	c.log = append(c.log, storeOp{op: "claim", tenant: p.Tenant, key: p.Key, won: err == nil && res.Won})
	c.mu.Unlock()
	switch {
	case mutant("claim-wins") && err == nil && !res.Won:
		return idem.ClaimResult{Won: true}, nil
	case mutant("fail-open") && err != nil:
		return idem.ClaimResult{Won: true}, nil
	}
	return res, err
}

// inClaim reports how many claims are under way.
func (c *countingStore) inClaim() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.claiming
}

func (c *countingStore) wonClaims(tenant, key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.won[[2]string{tenant, key}]
}

// takeLog returns the operations logged since the last call.
func (c *countingStore) takeLog() []storeOp {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.log
	c.log = nil
	return l
}

func (c *countingStore) Begin(ctx context.Context) (idem.UnitOfWork, error) {
	c.record(storeOp{op: "begin"})
	tx, err := c.Store.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &countingTx{UnitOfWork: tx, c: c}, nil
}

func (c *countingStore) Extend(ctx context.Context, p idem.ExtendParams) error {
	c.record(storeOp{op: "extend", tenant: p.Tenant, key: p.Key})
	return c.Store.Extend(ctx, p)
}

func (c *countingStore) Release(ctx context.Context, p idem.ReleaseParams) error {
	c.record(storeOp{op: "release", tenant: p.Tenant, key: p.Key})
	if mutant("skip-release") {
		return nil
	}
	return c.Store.Release(ctx, p)
}

func (c *countingStore) Get(ctx context.Context, tenant, key string) (*idem.Record, error) {
	c.record(storeOp{op: "get", tenant: tenant, key: key})
	return c.Store.Get(ctx, tenant, key)
}

type countingTx struct {
	idem.UnitOfWork
	c *countingStore
}

func (t *countingTx) Complete(ctx context.Context, p idem.CompleteParams) error {
	t.c.record(storeOp{op: "complete", tenant: p.Tenant, key: p.Key})
	if mutant("store-cookie") {
		h := map[string][]string{"Set-Cookie": {"session=leaked"}}
		for k, v := range p.Result.Header {
			h[k] = v
		}
		p.Result.Header = h
	}
	return t.UnitOfWork.Complete(ctx, p)
}

// orderRow and recordRow are what the final checks read back.
type orderRow struct {
	id                int64
	tenant, key, item string
}

type recordRow struct {
	tenant, key, state string
	status             int
	body               []byte
}

func (d *database) orders(t *testing.T) []orderRow {
	t.Helper()
	rows, err := d.check.QueryContext(context.Background(), `SELECT id, tenant, idem_key, item FROM orders ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []orderRow
	for rows.Next() {
		var o orderRow
		if err := rows.Scan(&o.id, &o.tenant, &o.key, &o.item); err != nil {
			t.Fatal(err)
		}
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func (d *database) records(t *testing.T) []recordRow {
	t.Helper()
	rows, err := d.check.QueryContext(context.Background(), `SELECT tenant_id, idem_key, state, COALESCE(status_code, 0), response_body FROM idem_keys`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []recordRow
	for rows.Next() {
		var r recordRow
		if err := rows.Scan(&r.tenant, &r.key, &r.state, &r.status, &r.body); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// ordersOf returns the orders written under (tenant, key).
func (d *database) ordersOf(t *testing.T, tenant, key string) []orderRow {
	t.Helper()
	var out []orderRow
	for _, o := range d.orders(t) {
		if o.tenant == tenant && o.key == key {
			out = append(out, o)
		}
	}
	return out
}

// exec runs a statement on the check handle, for the tests that tamper
// with stored rows.
func (d *database) exec(t *testing.T, query string) {
	t.Helper()
	if _, err := d.check.ExecContext(context.Background(), query); err != nil {
		t.Fatal(err)
	}
}

// wantProblem fails t unless a is an idemhttp problem+json answer with
// status and slug.
func wantProblem(t *testing.T, a answer, status int, slug string) {
	t.Helper()
	if a.err != nil || a.status != status || a.problem() != slug {
		t.Fatalf("got %v, want %d problem+json %s", a, status, slug)
	}
}

// eventually polls cond until it holds. It waits for something to happen
// on the store's clock or in another goroutine; it asserts no duration,
// and only gives up after a patience far above any expected wait.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// idOf reads the order id out of a 201 body.
func idOf(t *testing.T, a answer) int64 {
	t.Helper()
	var b struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal(a.body, &b); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	return b.ID
}
