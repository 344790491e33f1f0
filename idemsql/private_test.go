package idemsql_test

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/testenv"
)

// TestMain stops the private servers the tests started.
func TestMain(m *testing.M) {
	code := m.Run()
	stopPrivate()
	os.Exit(code)
}

// privateMariaDB is a MariaDB server of this test process, for settings a
// test must not make on the shared server (global, read-only ones).
var privateMariaDB struct {
	once   sync.Once
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited
	dir    string
	dsn    string
	err    error
}

func stopPrivate() {
	p := &privateMariaDB
	if p.exited != nil {
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
}

// rollbackOnTimeoutDSN returns the DSN of a fresh database on a private
// MariaDB started with innodb_rollback_on_timeout on, once per test
// process.
func rollbackOnTimeoutDSN(t *testing.T) string {
	t.Helper()
	p := &privateMariaDB
	p.once.Do(func() { p.dsn, p.err = startMariaDB("--innodb-rollback-on-timeout=1") })
	if p.err != nil {
		testenv.Unavailable(t, "a private MariaDB server", p.err)
	}
	db, err := sql.Open("mysql", p.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	name := testenv.Name()
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatal(err)
	}
	cfg, err := mysql.ParseDSN(p.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	return cfg.FormatDSN()
}

// startMariaDB creates a data directory, starts mariadbd on a free port
// with the extra options, and waits until it answers.
func startMariaDB(options ...string) (string, error) {
	install, err := exec.LookPath("mariadb-install-db")
	if err != nil {
		return "", err
	}
	server := "/usr/sbin/mariadbd"
	if _, err := os.Stat(server); err != nil {
		if server, err = exec.LookPath("mariadbd"); err != nil {
			return "", err
		}
	}
	p := &privateMariaDB
	if p.dir, err = os.MkdirTemp("", "idemsql-mariadb-"); err != nil {
		return "", err
	}
	data := filepath.Join(p.dir, "data")
	out, err := exec.Command(install, "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("mariadb-install-db: %v\n%s", err, out)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	args := append([]string{"--no-defaults", "--datadir=" + data, "--socket=" + filepath.Join(p.dir, "sock"),
		"--pid-file=" + filepath.Join(p.dir, "pid"), fmt.Sprintf("--port=%d", port), "--bind-address=127.0.0.1",
		"--user=root", "--skip-grant-tables", "--skip-log-bin", "--innodb-buffer-pool-size=16M"}, options...)
	p.cmd = exec.Command(server, args...)
	log, err := os.Create(filepath.Join(p.dir, "server.log"))
	if err != nil {
		return "", err
	}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		return "", err
	}
	p.exited = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	dsn := fmt.Sprintf("root@tcp(127.0.0.1:%d)/", port)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return "", err
	}
	defer db.Close()
	// A bound on the wait for a server that will never answer, not an
	// assumption about how long it takes.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = db.PingContext(ctx)
		cancel()
		if err == nil {
			return dsn, nil
		}
		select {
		case <-p.exited:
			b, _ := os.ReadFile(filepath.Join(p.dir, "server.log"))
			return "", fmt.Errorf("mariadbd exited: %s", b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("mariadbd did not answer: %v", err)
		}
	}
}
