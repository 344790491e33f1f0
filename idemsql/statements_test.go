package idemsql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
)

// stmtLog records the statements sent to the database through a handle
// opened by openLogged, in order, as the driver received them.
type stmtLog struct {
	mu    sync.Mutex
	stmts []string
}

func (l *stmtLog) add(q string) {
	l.mu.Lock()
	l.stmts = append(l.stmts, strings.Join(strings.Fields(q), " "))
	l.mu.Unlock()
}

// take returns the statements recorded since the last take.
func (l *stmtLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.stmts
	l.stmts = nil
	return out
}

// openLogged opens a handle on env's database whose statements go to a
// stmtLog, through the dialect's own driver.
func openLogged(t *testing.T, env *testDB) (*sql.DB, *stmtLog) {
	t.Helper()
	var base driver.Connector
	switch env.dialect {
	case idemsql.SQLite:
		// idemsqlite.Open's settings, on the same file.
		plain := sqlOpen(t, "sqlite", "")
		drv := plain.Driver()
		plain.Close()
		dsn := "file:" + (&url.URL{Path: env.dsn}).EscapedPath() + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_txlock=immediate"
		base = dsnConnector{drv, dsn}
	case idemmysql.Dialect:
		cfg, err := mysql.ParseDSN(env.dsn)
		if err != nil {
			t.Fatal(err)
		}
		if base, err = mysql.NewConnector(cfg); err != nil {
			t.Fatal(err)
		}
	case idemsql.Postgres:
		cfg, err := pgx.ParseConfig(env.dsn)
		if err != nil {
			t.Fatal(err)
		}
		base = stdlib.GetConnector(*cfg)
	}
	log := &stmtLog{}
	db := sql.OpenDB(logConnector{base, log})
	db.SetMaxOpenConns(4)
	t.Cleanup(func() { db.Close() })
	return db, log
}

type dsnConnector struct {
	drv driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.drv.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.drv }

type logConnector struct {
	driver.Connector
	log *stmtLog
}

func (c logConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &logConn{Conn: conn, log: c.log}, nil
}

// logConn passes every optional interface of database/sql through to the
// driver's connection, recording the statements.
type logConn struct {
	driver.Conn
	log *stmtLog
}

func (c *logConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	e, ok := c.Conn.(driver.ExecerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	res, err := e.ExecContext(ctx, q, args)
	if err != driver.ErrSkip {
		c.log.add(q)
	}
	return res, err
}

func (c *logConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	e, ok := c.Conn.(driver.QueryerContext)
	if !ok {
		return nil, driver.ErrSkip
	}
	rows, err := e.QueryContext(ctx, q, args)
	if err != driver.ErrSkip {
		c.log.add(q)
	}
	return rows, err
}

// PrepareContext records nothing: the statement is recorded at each run
// (logStmt), so that a statement prepared once and run many times shows
// as many times as it runs, and one run through a prepare (MySQL's driver,
// for a query with arguments) once.
func (c *logConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
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
	return &logStmt{Stmt: st, conn: c.Conn, q: q, log: c.log}, nil
}

// logStmt records its statement at each run.
type logStmt struct {
	driver.Stmt
	conn driver.Conn
	q    string
	log  *stmtLog
}

func (s *logStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	s.log.add(s.q)
	if e, ok := s.Stmt.(driver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	values := make([]driver.Value, len(args))
	for i, a := range args {
		values[i] = a.Value
	}
	//lint:ignore SA1019 the fallback database/sql itself uses
	return s.Stmt.Exec(values)
}

func (s *logStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	s.log.add(s.q)
	if q, ok := s.Stmt.(driver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	values := make([]driver.Value, len(args))
	for i, a := range args {
		values[i] = a.Value
	}
	//lint:ignore SA1019 the fallback database/sql itself uses
	return s.Stmt.Query(values)
}

func (s *logStmt) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := s.Stmt.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	if n, ok := s.conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *logConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	c.log.add("database/sql BeginTx")
	if b, ok := c.Conn.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	//lint:ignore SA1019 the fallback database/sql itself uses
	return c.Conn.Begin()
}

func (c *logConn) CheckNamedValue(v *driver.NamedValue) error {
	if n, ok := c.Conn.(driver.NamedValueChecker); ok {
		return n.CheckNamedValue(v)
	}
	return driver.ErrSkip
}

func (c *logConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *logConn) IsValid() bool {
	if v, ok := c.Conn.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *logConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

// isMariaDB reports whether env's server is MariaDB, where idemsql folds
// statements into compound ones (mariadb.go).
func isMariaDB(t *testing.T, env *testDB) bool {
	t.Helper()
	if env.dialect != idemmysql.Dialect {
		return false
	}
	var version string
	if err := env.db.QueryRow(`SELECT VERSION()`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	return strings.Contains(strings.ToLower(version), "mariadb")
}

// kinds names each statement by its first words, enough to tell a claim,
// a completion, a BEGIN and the handler's own statements apart.
func kinds(stmts []string) []string {
	out := make([]string, len(stmts))
	for i, s := range stmts {
		f := strings.Fields(s)
		switch {
		// MariaDB's compound statements (mariadb.go).
		case strings.HasPrefix(s, "BEGIN NOT ATOMIC") && strings.Contains(s, "FOUND_ROWS()"):
			out[i] = "peek and claim"
		case strings.HasPrefix(s, "BEGIN NOT ATOMIC") && strings.Contains(s, "INSERT INTO idem_keys"):
			out[i] = "begin and claim"
		case strings.HasPrefix(s, "BEGIN NOT ATOMIC") && strings.Contains(s, "UPDATE idem_keys SET state = 'complete'"):
			out[i] = "complete and commit"
		case strings.HasPrefix(s, "BEGIN NOT ATOMIC SET autocommit = 0; SAVEPOINT"):
			out[i] = "begin"
		// SQLite's texts of two statements.
		case strings.HasPrefix(s, "BEGIN IMMEDIATE; SAVEPOINT"):
			out[i] = "begin"
		case strings.HasPrefix(s, "RELEASE SAVEPOINT") && strings.Contains(s, "UPDATE idem_keys SET state = 'complete'"):
			out[i] = "release and complete"
		case strings.HasPrefix(s, "INSERT INTO idem_keys"), strings.HasPrefix(s, "WITH prev AS"):
			out[i] = "claim"
		case strings.HasPrefix(s, "SELECT tenant_id") && strings.Contains(s, "state = 'complete' AND expires_at >"):
			out[i] = "peek"
		case strings.HasPrefix(s, "PRAGMA synchronous ="):
			out[i] = s
		case strings.HasPrefix(s, "UPDATE idem_keys SET state = 'complete'"):
			out[i] = "complete"
		case len(f) >= 3:
			out[i] = strings.Join(f[:3], " ")
		default:
			out[i] = s
		}
	}
	return out
}
