//go:build linux

package dbcrash

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/internal/testenv"
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
	// binlog is true when the binary log is on, with sync_binlog=1.
	binlog bool
}

// startMariaDB creates a data directory (mariadb-install-db) and starts
// mariadbd on it, on a free port, with the global option files ignored
// (--no-defaults: they name the shared server's socket, port and log).
// With binlog, the binary log is on and synced at every commit group
// (sync_binlog=1), as on a server with replicas or point-in-time
// recovery.
func startMariaDB(t *testing.T, binlog bool) *mariadb {
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
	m := &mariadb{addr: fmt.Sprintf("127.0.0.1:%d", port), flush: "1", binlog: binlog}
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
		// Synchronous I/O instead of io_uring: a SIGKILL of MariaDB
		// 10.11 during io_uring writes once left a redo log its own
		// recovery refused ("Data structure corruption"), a server bug
		// that says nothing about idem. What this test measures, the
		// commit's durability, does not depend on the I/O interface.
		"--innodb-use-native-aio=0",
		"--max-connections=100",
	}
	if binlog {
		argv = append(argv, "--log-bin="+filepath.Join(dir, "binlog"), "--sync-binlog=1", "--server-id=1")
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
	if err := idemmigrate.Migrate(ctx, db, idemmysql.Dialect.MigrateDialect()); err != nil {
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
		name:  fmt.Sprintf("MariaDB (idemsql, innodb_flush_log_at_trx_commit=%s, binary log %s)", m.flush, map[bool]string{false: "off", true: "on, sync_binlog=1"}[m.binlog]),
		srv:   m.srv,
		ready: m.ready,
		insert: func(ctx context.Context, key, nonce string) error {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (tenant_id, idem_key, nonce) VALUES (?, ?, ?)`, tenant, key, nonce)
			return err
		},
		read:          m.read,
		claimsDurable: m.flush == "1",
	}
	if db != nil {
		tg.store = testenv.Must(idemsql.NewStore(db, idemmysql.Dialect))
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

// knownLoss skips a test that shows the loss on MariaDB without the
// binary log, unless IDEM_DBCRASH_KNOWN_LOSS=1: how to close it (in
// idemsql, or by requiring the binary log) is not decided yet.
func knownLoss(t *testing.T) {
	t.Helper()
	if os.Getenv("IDEM_DBCRASH_KNOWN_LOSS") != "1" {
		t.Skip("skipping: known loss, undecided fix: without the binary log, InnoDB shows a commit to other sessions " +
			"before its redo log is written, and idemsql replays such a completion; a crash then loses an answered operation " +
			"(TestMariaDBReplayOfUnwrittenCompletion shows it). Set IDEM_DBCRASH_KNOWN_LOSS=1 to run")
	}
}

// TestMariaDBCrash is TestPostgresCrash on MariaDB through idemsql's
// MySQL dialect: mariadbd is killed with SIGKILL at random moments under
// load and restarted (InnoDB recovers from its redo log). With
// innodb_flush_log_at_trx_commit=1 every commit, the claim's included, is
// on disk when it returns, so no crash may erase a won claim either.
//
// Without the binary log, a duplicate can be answered with a completion
// whose redo log is not written yet, which a crash then loses (see
// TestMariaDBReplayOfUnwrittenCompletion): about two runs in five lose
// one such answer. With the binary log synced at each commit, InnoDB
// shows a commit only once it is recoverable.
func TestMariaDBCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: kills a private MariaDB for seconds (-short)")
	}
	for _, binlog := range []bool{false, true} {
		t.Run(map[bool]string{false: "binlog-off", true: "binlog-on"}[binlog], func(t *testing.T) {
			if !binlog && !strings.HasPrefix(mutant(), "mariadb-") {
				knownLoss(t)
			}
			m := startMariaDB(t, binlog)
			runCrashes(t, m.target(m.db(t)))
		})
	}
}

// TestMariaDBReplayOfUnwrittenCompletion reproduces, step by step, how a
// crash of MariaDB loses an operation idem answered as done:
//
//  1. client A's execution runs; its completion's COMMIT reaches InnoDB,
//     which marks the transaction committed in memory, releases its
//     locks and shows it to other sessions, then writes its redo log,
//     which strace holds back (pwrite64 delayed by seconds);
//  2. meanwhile client B sends the same key: idemsql's claim finds the
//     record complete and B gets A's answer, replayed;
//  3. the server is killed before the redo log write.
//
// After the restart the database holds neither the order nor the record:
// B was told the operation was done, and A's retry runs it again, with
// another answer. With the binary log on (sync_binlog=1), InnoDB shows
// the commit only after the prepared transaction and the binary log are
// on disk, and recovery keeps it.
func TestMariaDBReplayOfUnwrittenCompletion(t *testing.T) {
	for _, binlog := range []bool{false, true} {
		t.Run(map[bool]string{false: "binlog-off", true: "binlog-on"}[binlog], func(t *testing.T) {
			if !binlog {
				knownLoss(t)
			}
			replayOfUnwrittenCompletion(t, binlog)
		})
	}
}

func replayOfUnwrittenCompletion(t *testing.T, binlog bool) {
	straceBin := findBinary(t, "strace", "strace", "/usr/bin/strace")
	m := startMariaDB(t, binlog)
	db := m.db(t)
	tg := m.target(db)
	ctx := context.Background()
	// The heartbeat off: its extensions would wait on the held writes.
	engine, err := idem.NewEngine(tg.store, &idem.Config{Lease: time.Minute, Heartbeat: -1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(context.Background()) })
	const key = "replayed-then-lost"
	op := idem.Operation{Tenant: tenant, Key: key, Fingerprint: []byte("POST /orders " + key)}

	// A's execution: its handler writes the order, then waits while the
	// test holds back every redo log write of the server, so that its
	// completion's COMMIT is shown to other sessions but not written.
	written := make(chan string, 1)
	held := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(stopped) })
	type result struct {
		out idem.Outcome
		err error
	}
	aDone := make(chan result, 1)
	go func() {
		out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			answer := nonce()
			if err := tg.insert(ctx, key, answer); err != nil {
				return idem.Result{}, err
			}
			written <- answer
			select {
			case <-held:
			case <-stopped:
				return idem.Result{}, errors.New("the test ended")
			}
			return idem.Result{Mode: idem.ModeResponse, Status: 201, Body: []byte(answer)}, nil
		})
		aDone <- result{out, err}
	}()
	var aAnswer string
	select {
	case aAnswer = <-written:
	case r := <-aDone:
		t.Fatalf("A's execution ended before its write: %+v, %v", r.out, r.err)
	}
	strace := holdWrites(t, straceBin, m.srv.cmd.Process.Pid)
	close(held)

	// B sends the same key until it gets an answer.
	var bOut idem.Outcome
	var aReturned bool
	for deadline := time.Now().Add(time.Minute); ; {
		out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{}, fmt.Errorf("B ran the operation A holds")
		})
		if err == nil {
			bOut = out
			select {
			case <-aDone:
				aReturned = true
			default:
			}
			break
		}
		if !errors.Is(err, idem.ErrInFlight) || time.Now().After(deadline) {
			t.Fatalf("B: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !bOut.Replayed || string(bOut.Result.Body) != aAnswer {
		t.Fatalf("B got %+v, want A's answer %q replayed", bOut, aAnswer)
	}
	if !binlog && aReturned {
		t.Fatalf("A's COMMIT returned before B's replay: the redo log write was not held back, the run shows nothing")
	}

	// The server dies with the write still held.
	if err := m.srv.crash(); err != nil {
		t.Fatal(err)
	}
	_ = strace.Wait()
	if err := tg.restart(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := tg.read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rec, ok := st.records[key]
	orders := st.orders[key]
	if !ok || rec.state != string(idem.StateComplete) || rec.body != aAnswer || len(orders) != 1 || orders[0] != aAnswer {
		t.Errorf("B was answered %q (replayed) before A's COMMIT returned (A returned: %v); after SIGKILL and restart the database holds record %+v (present %v) and orders %v: the answered operation is lost, and A's retry will run it again",
			bOut.Result.Body, aReturned, rec, ok, orders)
	}
}

// holdWrites attaches strace to every thread of pid, delaying each
// pwrite64 (InnoDB's redo log writes) by 2s, and returns once every
// thread is traced. The tracer ends when the server dies.
func holdWrites(t *testing.T, straceBin string, pid int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(straceBin, "-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64",
		"-e", "inject=pwrite64:delay_enter=2000000", "-p", fmt.Sprint(pid))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		testenv.Unavailable(t, "strace", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for deadline := time.Now().Add(time.Minute); !allTraced(pid); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			testenv.Unavailable(t, "strace attached to mariadbd (ptrace)", fmt.Errorf("%s", stderr.String()))
		}
	}
	return cmd
}

// allTraced reports whether every thread of pid has a tracer.
func allTraced(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, task.Name()))
		if err != nil {
			return false
		}
		_, rest, _ := strings.Cut(string(b), "TracerPid:")
		if f := strings.Fields(rest); len(f) == 0 || f[0] == "0" {
			return false
		}
	}
	return true
}
