package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// With -store mysql or -store sqlite, the routes run on database/sql and
// idemsql instead of pgx and idempg: (a) the bare handler in its own
// transaction, (b) and (c) the same handler behind idemhttp on
// idemsql.Store, (d) the naive check-then-write, and with -single (f) and
// (g) on idemsql in the single-transaction mode (sqlsingle.go). The
// business table and
// the routes are the PostgreSQL ones, in each database's SQL. Round trips
// are counted as statements sent through database/sql (a BEGIN, COMMIT
// or SAVEPOINT included); the database's CPU is not measured (MariaDB's
// server is shared with other programs, SQLite runs inside this process
// and is counted in Go CPU).

// sqlSchema is schemaSQL for MySQL/MariaDB and SQLite, one statement per
// string.
var sqlSchema = map[string][]string{
	"mysql": {
		`CREATE TABLE orders (
	id          BIGINT AUTO_INCREMENT PRIMARY KEY,
	tenant_id   VARCHAR(64) NOT NULL,
	cart_id     VARCHAR(64) NOT NULL,
	total_cents BIGINT NOT NULL,
	idem_key    VARCHAR(255),
	created_at  DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
	KEY orders_idem_key (idem_key)
) ENGINE = InnoDB`,
		`CREATE TABLE naive_keys (
	idem_key VARCHAR(255) PRIMARY KEY,
	status   INT NOT NULL,
	body     LONGBLOB NOT NULL
) ENGINE = InnoDB`,
	},
	"sqlite": {
		`CREATE TABLE orders (
	id          INTEGER PRIMARY KEY,
	tenant_id   TEXT NOT NULL,
	cart_id     TEXT NOT NULL,
	total_cents INTEGER NOT NULL,
	idem_key    TEXT,
	created_at  INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000000) AS INTEGER))
)`,
		`CREATE INDEX orders_idem_key ON orders (idem_key)`,
		`CREATE TABLE naive_keys (
	idem_key TEXT PRIMARY KEY,
	status   INTEGER NOT NULL,
	body     BLOB NOT NULL
)`,
	},
}

// openSQLDatabase opens a fresh database for -store mysql (a database of
// its own on the server dsn names, dropped at the end) or sqlite (a file
// in a temporary directory, removed at the end), migrated, with the
// business tables, its statements counted in db.writes.
func openSQLDatabase(ctx context.Context, store, dsn string, conns int) (*database, error) {
	var b [6]byte
	_, _ = rand.Read(b[:])
	db := &database{store: store, schema: "loadbench_" + hex.EncodeToString(b[:])}
	var connector driver.Connector
	switch store {
	case "mysql":
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("-mysql: %w", err)
		}
		admin, err := mysql.NewConnector(cfg)
		if err != nil {
			return nil, err
		}
		root := sql.OpenDB(admin)
		defer root.Close()
		if _, err := root.ExecContext(ctx, "CREATE DATABASE "+db.schema); err != nil {
			return nil, err
		}
		db.dropSQL = func() {
			root := sql.OpenDB(admin)
			defer root.Close()
			_, _ = root.ExecContext(context.Background(), "DROP DATABASE "+db.schema)
		}
		cfg.DBName = db.schema
		if connector, err = mysql.NewConnector(cfg); err != nil {
			db.drop()
			return nil, err
		}
		db.dialect = idemmysql.Dialect
	case "sqlite":
		dir, err := os.MkdirTemp("", "loadbench-sqlite")
		if err != nil {
			return nil, err
		}
		db.dropSQL = func() { _ = os.RemoveAll(dir) }
		// idemsqlite.Open's settings, through a counting connector: the
		// same driver, the same DSN.
		plain, err := idemsqlite.Open(filepath.Join(dir, "app.db"))
		if err != nil {
			db.drop()
			return nil, err
		}
		drv := plain.Driver()
		plain.Close()
		connector = dsnConnector{drv, sqliteDSN(filepath.Join(dir, "app.db"))}
		db.dialect = idemsql.SQLite
		conns = idemsqlite.MaxOpenConns
	default:
		return nil, fmt.Errorf("-store %q: want postgres, mysql or sqlite", store)
	}
	db.sql = sql.OpenDB(countingConnector{connector, &db.writes, &db.reads})
	db.sql.SetMaxOpenConns(conns)
	db.sql.SetMaxIdleConns(conns)
	if err := idemmigrate.Migrate(ctx, db.sql, db.dialect.MigrateDialect()); err != nil {
		db.close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, q := range sqlSchema[store] {
		if _, err := db.sql.ExecContext(ctx, q); err != nil {
			db.close()
			return nil, err
		}
	}
	return db, nil
}

// sqliteDSN is the DSN idemsqlite.Open gives the driver for path.
func sqliteDSN(path string) string {
	return "file:" + filepath.ToSlash(path) + "?_pragma=busy_timeout(" + strconv.Itoa(idemsqlite.BusyTimeout) +
		")&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)&_txlock=immediate"
}

type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

// countingConnector counts the statements its connections run, and the
// statements they prepare.
type countingConnector struct {
	driver.Connector
	n, prepares *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingSQLConn{Conn: conn, n: c.n, prepares: c.prepares}, nil
}

// countingSQLConn passes database/sql's optional interfaces through to the
// driver's connection, counting each statement.
type countingSQLConn struct {
	driver.Conn
	n, prepares *atomic.Int64
}

func (c *countingSQLConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	res, err := e.ExecContext(ctx, q, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.n.Add(1)
	}
	return res, err
}

func (c *countingSQLConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	e, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	rows, err := e.QueryContext(ctx, q, args)
	if !errors.Is(err, driver.ErrSkip) {
		c.n.Add(1)
	}
	return rows, err
}

// PrepareContext counts a prepare in db.reads (MySQL's driver prepares a
// query with arguments before running it, a round trip of its own), and
// the statement at each run.
func (c *countingSQLConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	c.prepares.Add(1)
	var st driver.Stmt
	var err error
	if p, ok := c.Conn.(driver.ConnPrepareContext); ok {
		st, err = p.PrepareContext(ctx, q)
	} else {
		st, err = c.Conn.Prepare(q)
	}
	if err != nil {
		return nil, err
	}
	return &countingStmt{Stmt: st, conn: c.Conn, n: c.n}, nil
}

// countingStmt counts its runs.
type countingStmt struct {
	driver.Stmt
	conn driver.Conn
	n    *atomic.Int64
}

func (s *countingStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.n.Add(1)
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	//lint:ignore SA1019 the fallback database/sql itself uses
	return s.Stmt.Exec(values(args))
}

func (s *countingStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.n.Add(1)
	if q, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	//lint:ignore SA1019 the fallback database/sql itself uses
	return s.Stmt.Query(values(args))
}

func (s *countingStmt) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	if n, ok := s.conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func values(args []driver.NamedValue) []driver.Value {
	out := make([]driver.Value, len(args))
	for i, a := range args {
		out[i] = a.Value
	}
	return out
}

func (c *countingSQLConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	var tx driver.Tx
	var err error
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		tx, err = b.BeginTx(ctx, opts)
	} else {
		//lint:ignore SA1019 the fallback database/sql itself uses
		tx, err = c.Conn.Begin()
	}
	if err != nil {
		return nil, err
	}
	return countingTx{tx, c.n}, nil
}

// countingTx counts the COMMIT or ROLLBACK of a database/sql transaction.
type countingTx struct {
	driver.Tx
	n *atomic.Int64
}

func (t countingTx) Commit() error {
	t.n.Add(1)
	return t.Tx.Commit()
}

func (t countingTx) Rollback() error {
	t.n.Add(1)
	return t.Tx.Rollback()
}

func (c *countingSQLConn) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *countingSQLConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countingSQLConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *countingSQLConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// sqlInsertOrder is insertOrder on MySQL and SQLite: the id comes from the
// statement's last insert id.
const sqlInsertOrder = `INSERT INTO orders (tenant_id, cart_id, total_cents, idem_key) VALUES (?, ?, ?, ?)`

// createSQLOrder is createOrder on database/sql: one INSERT in the
// transaction tx returns.
func createSQLOrder(tx func(ctx context.Context) (idemsql.DBTX, func(error) error, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req orderRequest
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&req); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		o := order{TenantID: tenant, CartID: req.CartID, TotalCents: req.TotalCents}
		key := r.Header.Get(idemhttp.HeaderKey)
		q, end, err := tx(r.Context())
		if err == nil {
			var res sql.Result
			res, err = q.ExecContext(r.Context(), sqlInsertOrder, tenant, req.CartID, req.TotalCents, key)
			if err == nil {
				o.ID, err = res.LastInsertId()
			}
			err = end(err)
		}
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

// newSQLMux builds routes (a), (b)/(c) and (d) on db.
func newSQLMux(db *database) (*http.ServeMux, error) {
	pool := db.sql
	own := func(ctx context.Context) (idemsql.DBTX, func(error) error, error) {
		tx, err := pool.BeginTx(ctx, nil)
		if err != nil {
			return nil, nil, err
		}
		return tx, func(err error) error {
			if err != nil {
				_ = tx.Rollback()
				return err
			}
			return tx.Commit()
		}, nil
	}
	store, err := idemsql.NewStore(pool, db.dialect)
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
	engineTx := func(ctx context.Context) (idemsql.DBTX, func(error) error, error) {
		return idemsql.TxFromContext(ctx), func(err error) error { return err }, nil
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+routeBare, createSQLOrder(own))
	mux.Handle("POST "+routeIdem, mw.Handler(createSQLOrder(engineTx)))
	mux.Handle("POST "+routeNaive, naiveSQL(db, createSQLOrder(own)))
	if err := addSQLSingleRoutes(mux, db); err != nil {
		return nil, err
	}
	return mux, nil
}

// naiveSQL is naive on database/sql.
func naiveSQL(db *database, next http.Handler) http.Handler {
	insert := `INSERT INTO naive_keys (idem_key, status, body) VALUES (?, ?, ?) ON CONFLICT DO NOTHING`
	if db.store == "mysql" {
		insert = `INSERT IGNORE INTO naive_keys (idem_key, status, body) VALUES (?, ?, ?)`
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "" {
			next.ServeHTTP(w, r)
			return
		}
		var status int
		var body []byte
		err := db.sql.QueryRowContext(r.Context(), `SELECT status, body FROM naive_keys WHERE idem_key = ?`, key).
			Scan(&status, &body)
		switch {
		case err == nil:
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(idemhttp.HeaderReplayed, "true")
			w.WriteHeader(status)
			_, _ = w.Write(body)
			return
		case !errors.Is(err, sql.ErrNoRows):
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		rec := &recorder{header: http.Header{}}
		next.ServeHTTP(rec, r)
		if rec.status < 500 {
			_, _ = db.sql.ExecContext(r.Context(), insert, key, rec.status, rec.body)
		}
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body)
	})
}

// countSQLOrders counts the orders of the keys starting with prefix, as
// runPairs does on PostgreSQL.
func countSQLOrders(ctx context.Context, db *database, prefix string, res *pairs) error {
	return db.sql.QueryRowContext(ctx, `
		SELECT COALESCE(SUM(n), 0), COALESCE(SUM(CASE WHEN n > 1 THEN 1 ELSE 0 END), 0), COALESCE(SUM(n - 1), 0)
		FROM (SELECT COUNT(*) AS n FROM orders WHERE idem_key LIKE ? GROUP BY idem_key) per_key`,
		prefix+"-%").Scan(&res.orders, &res.duplicateKeys, &res.extraOrders)
}

// describeSQL fills in the database's version and settings.
func describeSQL(ctx context.Context, db *database, m *machine) {
	switch db.store {
	case "mysql":
		_ = db.sql.QueryRowContext(ctx, `SELECT VERSION()`).Scan(&m.pgVersion)
		// One variable at a time: MariaDB calls the isolation
		// tx_isolation, MySQL 8 transaction_isolation.
		var settings []string
		for _, name := range []string{"innodb_flush_log_at_trx_commit", "log_bin", "sync_binlog", "transaction_isolation", "tx_isolation"} {
			var v string
			if err := db.sql.QueryRowContext(ctx, `SELECT @@`+name).Scan(&v); err == nil {
				settings = append(settings, name+"="+v)
			}
		}
		m.pgSettings = strings.Join(settings, ", ")
	case "sqlite":
		_ = db.sql.QueryRowContext(ctx, `SELECT sqlite_version()`).Scan(&m.pgVersion)
		var mode string
		var synchronous int
		_ = db.sql.QueryRowContext(ctx, `SELECT journal_mode, synchronous FROM pragma_journal_mode, pragma_synchronous`).Scan(&mode, &synchronous)
		m.pgSettings = "idemsqlite.Open: journal_mode=" + mode + ", synchronous=" + strconv.Itoa(synchronous) +
			", busy_timeout " + strconv.Itoa(idemsqlite.BusyTimeout) + " ms, a pool of " + strconv.Itoa(idemsqlite.MaxOpenConns)
	}
}

// writeSQLReport is writeReport for -store mysql and sqlite: the same
// ratios, with statements per request for round trips and without the
// database's own CPU.
func writeSQLReport(w io.Writer, m machine, b *bench, rounds, conns int, slice time.Duration, phases []*phase, dups []*pairs) {
	name := map[string]string{"mysql": "MariaDB/MySQL", "sqlite": "SQLite"}[b.db.store]
	fmt.Fprintf(w, "## Loopback HTTP on %s (idemsql)\n\n", name)
	fmt.Fprintf(w, "- machine: %d CPUs, %s; %s\n", m.cpus, m.cpuModel, m.goVersion)
	fmt.Fprintf(w, "- %s %s: %s\n", name, m.pgVersion, m.pgSettings)
	fmt.Fprintf(w, "- load average (1 5 15 min): %s before, %s after\n", m.loadBefore, m.loadAfter)
	fmt.Fprintf(w, "- %d clients, pool of %d connections, %s per scenario per round in slices of %s (scenarios alternate every slice, order rotated), %d rounds\n\n",
		b.clients, conns, b.duration, slice, rounds)
	fmt.Fprintf(w, "| scenario | req/s | p50 | p99 | × (a), median | × (a), min–max | statements/req | prepares/req | Go CPU/req | failures |\n")
	fmt.Fprintf(w, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, sc := range b.scenarios {
		var rps, ratios, stmts, prepares []float64
		var p50, p99, goCPU []time.Duration
		failures := 0
		for _, p := range phases {
			if p.scenario.id != sc.id {
				continue
			}
			rps = append(rps, p.throughput())
			ratios = append(ratios, p.throughput()/baseline(phases, p))
			stmts = append(stmts, p.perRequest(p.writes))
			prepares = append(prepares, p.perRequest(p.reads))
			p50 = append(p50, p.percentile(0.50))
			p99 = append(p99, p.percentile(0.99))
			goCPU = append(goCPU, p.cpuUse().selfPerReq)
			failures += p.failures
		}
		if len(rps) == 0 {
			continue
		}
		fmt.Fprintf(w, "| (%s) %s | %.0f | %s | %s | **%.2f** | %.2f–%.2f | %.2f | %.2f | %s | %d |\n", sc.id, sc.name,
			median(rps), ms(median(p50)), ms(median(p99)), median(ratios),
			slices.Min(ratios), slices.Max(ratios), median(stmts), median(prepares), us(median(goCPU)), failures)
	}
	fmt.Fprintf(w, "\nMedians over the rounds; each ratio is taken within its round against (a) of that round. Statements are those database/sql ran (BEGIN, COMMIT, SAVEPOINT included); prepares are the statements it prepared first, a round trip of their own on MySQL (whose driver prepares every query with arguments unless the DSN sets interpolateParams). Go CPU is this whole process: HTTP server, handlers, idem, the driver, the HTTP clients, and on SQLite the database itself.\n\n")
	fmt.Fprintf(w, "<details><summary>Every round</summary>\n\n")
	fmt.Fprintf(w, "| round | scenario | requests | req/s | p50 | p99 | × (a) | statements/req | prepares/req | Go CPU/req | machine busy | statuses |\n")
	fmt.Fprintf(w, "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, p := range phases {
		u := p.cpuUse()
		fmt.Fprintf(w, "| %d | (%s) | %d | %.0f | %s | %s | %.2f | %.2f | %.2f | %s | %.0f%% | %s |\n", p.round, p.scenario.id,
			p.requests, p.throughput(), ms(p.percentile(0.50)), ms(p.percentile(0.99)),
			p.throughput()/baseline(phases, p), p.perRequest(p.writes), p.perRequest(p.reads), us(u.selfPerReq),
			100*u.machineBusy, statuses(p))
	}
	fmt.Fprintf(w, "\n</details>\n\n")
	writeDups(w, dups)
}
