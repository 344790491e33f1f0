//go:build linux

package dbcrash

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
)

func init() {
	// The driver logs every connection the crashes cut.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
}

// mariadb is a private MariaDB server.
type mariadb struct {
	srv  *server
	addr string // 127.0.0.1:port
	// flush is its innodb_flush_log_at_trx_commit.
	flush string
}

// startMariaDB creates a data directory (mariadb-install-db) and starts
// mariadbd on it, on a free port, with the global option files ignored
// (--no-defaults: they name the shared server's socket, port and log).
func startMariaDB(t *testing.T) *mariadb {
	t.Helper()
	install := findBinary(t, "mariadb-install-db", "mariadb-install-db", "/usr/bin/mariadb-install-db", "mysql_install_db")
	bin := findBinary(t, "mariadbd", "/usr/sbin/mariadbd", "mariadbd", "/usr/sbin/mysqld")
	dir := privateDir(t, "idem-dbcrash-mariadb-", nil)
	data := filepath.Join(dir, "data")
	root := os.Geteuid() == 0
	args := []string{install, "--no-defaults", "--datadir=" + data, "--auth-root-authentication-method=normal", "--skip-test-db"}
	if root {
		// mariadbd refuses to run as root unless told to.
		args = append(args, "--user=root")
	}
	if err := runAs(nil, args...); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	m := &mariadb{addr: fmt.Sprintf("127.0.0.1:%d", port), flush: "1"}
	switch mutant() {
	case "mariadb-flush-0":
		m.flush = "0"
	case "mariadb-flush-2":
		m.flush = "2"
	}
	argv := []string{bin, "--no-defaults",
		"--datadir=" + data,
		"--socket=" + filepath.Join(dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(dir, "mysqld.pid"),
		fmt.Sprintf("--port=%d", port),
		"--bind-address=127.0.0.1",
		"--skip-grant-tables",
		"--innodb-buffer-pool-size=32M",
		"--innodb-flush-log-at-trx-commit=" + m.flush,
		"--max-connections=100",
	}
	if root {
		argv = append(argv, "--user=root")
	}
	m.srv = &server{name: "mariadbd", argv: argv, log: filepath.Join(dir, "mariadbd.log"), stopSignal: syscall.SIGTERM}
	t.Cleanup(func() {
		if err := m.srv.stop(); err != nil {
			t.Errorf("stop the private MariaDB: %v", err)
		}
	})
	if err := m.target(nil).restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	return m
}

// dsn is the go-sql-driver DSN of database name ("" for none).
func (m *mariadb) dsn(name string) string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = m.addr
	cfg.DBName = name
	cfg.ParseTime = true
	cfg.Timeout = 5 * time.Second
	return cfg.FormatDSN()
}

func (m *mariadb) ready(ctx context.Context) error {
	return pollReady(ctx, m.srv, func(ctx context.Context) error {
		db, err := sql.Open("mysql", m.dsn(""))
		if err != nil {
			return err
		}
		defer db.Close()
		return db.PingContext(ctx)
	})
}

// db creates the database with the idem table and the orders table, and
// opens it, closed when the test ends.
func (m *mariadb) db(t *testing.T) *sql.DB {
	t.Helper()
	ctx := context.Background()
	setup, err := sql.Open("mysql", m.dsn(""))
	if err != nil {
		t.Fatal(err)
	}
	defer setup.Close()
	if _, err := setup.ExecContext(ctx, `CREATE DATABASE dbcrash`); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", m.dsn("dbcrash"))
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(24)
	db.SetMaxIdleConns(24)
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(ctx, db, idemsql.MySQL.MigrateDialect()); err != nil {
		t.Fatal(err)
	}
	// No unique index on the key, on purpose (see the PostgreSQL one).
	if _, err := db.ExecContext(ctx, `CREATE TABLE orders (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		tenant_id VARBINARY(512) NOT NULL,
		idem_key VARBINARY(255) NOT NULL,
		nonce VARCHAR(32) NOT NULL
	) ENGINE = InnoDB`); err != nil {
		t.Fatal(err)
	}
	return db
}

func (m *mariadb) target(db *sql.DB) *target {
	tg := &target{
		name:  "MariaDB (idemsql, innodb_flush_log_at_trx_commit=" + m.flush + ")",
		srv:   m.srv,
		ready: m.ready,
		insert: func(ctx context.Context, key, nonce string) error {
			_, err := idemsql.Tx(ctx).ExecContext(ctx, `INSERT INTO orders (tenant_id, idem_key, nonce) VALUES (?, ?, ?)`, tenant, key, nonce)
			return err
		},
		read:          m.read,
		claimsDurable: m.flush == "1",
	}
	if db != nil {
		tg.store = idemsql.New(db, idemsql.MySQL)
	}
	return tg
}

func (m *mariadb) read(ctx context.Context) (*dbState, error) {
	db, err := sql.Open("mysql", m.dsn("dbcrash"))
	if err != nil {
		return nil, err
	}
	defer db.Close()
	st := &dbState{orders: map[string][]string{}, records: map[string]dbRecord{}}
	rows, err := db.QueryContext(ctx, `SELECT idem_key, nonce FROM orders WHERE tenant_id = ? ORDER BY nonce`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var key, n string
		if err := rows.Scan(&key, &n); err != nil {
			return nil, err
		}
		st.orders[key] = append(st.orders[key], n)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = db.QueryContext(ctx, `SELECT idem_key, state, lease_token, COALESCE(response_body, ''),
		CASE WHEN state = 'in_flight' AND locked_until > UTC_TIMESTAMP(6)
			THEN TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), locked_until) ELSE 0 END,
		UTC_TIMESTAMP(6)
		FROM idem_keys WHERE tenant_id = ?`, tenant)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var rec dbRecord
		var body []byte
		var waitMicros int64
		if err := rows.Scan(&key, &rec.state, &rec.token, &body, &waitMicros, &st.now); err != nil {
			return nil, err
		}
		rec.body = string(body)
		st.records[key] = rec
		st.maxWait = max(st.maxWait, time.Duration(waitMicros)*time.Microsecond)
	}
	return st, rows.Err()
}

// TestMariaDBCrash is TestPostgresCrash on MariaDB through idemsql's
// MySQL dialect: mariadbd is killed with SIGKILL at random moments under
// load and restarted (InnoDB recovers from its redo log). With
// innodb_flush_log_at_trx_commit=1 every commit, the claim's included, is
// on disk when it returns, so no crash may erase a won claim either.
func TestMariaDBCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: kills a private MariaDB for seconds (-short)")
	}
	m := startMariaDB(t)
	runCrashes(t, m.target(m.db(t)))
}
