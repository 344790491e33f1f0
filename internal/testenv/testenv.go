// Package testenv gives tests the real servers of the machine (PostgreSQL,
// MariaDB/MySQL, Redis, NATS, RabbitMQ), each isolated per test.
//
// Addresses come from environment variables with the local defaults:
//
//	IDEM_TEST_POSTGRES  postgres://postgres@127.0.0.1:5432/test?sslmode=disable
//	IDEM_TEST_MYSQL     root@tcp(127.0.0.1:3306)/test
//	IDEM_TEST_REDIS     redis://127.0.0.1:6379/0
//	IDEM_TEST_NATS      nats://127.0.0.1:4222
//	IDEM_TEST_AMQP      amqp://guest:guest@127.0.0.1:5672/
//
// When a server cannot be reached, the test is skipped with a one-line
// reason, except under CI=true, where a missing service fails the test:
// CI must never pass by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// Default addresses, used when the variables are unset.
const (
	DefaultPostgres = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	DefaultMySQL    = "root@tcp(127.0.0.1:3306)/test"
	DefaultRedis    = "redis://127.0.0.1:6379/0"
	DefaultNATS     = "nats://127.0.0.1:4222"
	DefaultAMQP     = "amqp://guest:guest@127.0.0.1:5672/"
)

// InCI reports whether the tests run under CI (CI=true), where a missing
// service is a failure.
func InCI() bool { return os.Getenv("CI") == "true" }

// Unavailable skips t with reason, or fails it under CI.
func Unavailable(t testing.TB, service string, err error) {
	t.Helper()
	if InCI() {
		t.Fatalf("%s is required under CI=true but unavailable: %v", service, err)
	}
	t.Skipf("skipping: %s unavailable (%v)", service, err)
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Name returns a fresh identifier fit for a schema, database or key
// prefix: "idemtest_" and 12 random hex digits.
func Name() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "idemtest_" + hex.EncodeToString(b[:])
}

func dial(t testing.TB, service, hostport string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", hostport, 2*time.Second)
	if err != nil {
		Unavailable(t, service, err)
		return
	}
	c.Close()
}

// PostgresURL returns the base PostgreSQL URL after checking that the
// server answers.
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := env("IDEM_TEST_POSTGRES", DefaultPostgres)
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		t.Fatalf("IDEM_TEST_POSTGRES: %v", err)
	}
	dial(t, "PostgreSQL", net.JoinHostPort(cfg.Host, fmt.Sprint(cfg.Port)))
	return u
}

// PostgresSchema creates a fresh schema, drops it when the test ends, and
// returns a URL whose connections use it as search_path. Tests sharing the
// database therefore never see each other's tables.
func PostgresSchema(t testing.TB) string {
	t.Helper()
	base := PostgresURL(t)
	name := Name()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		Unavailable(t, "PostgreSQL", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer c.Close(context.Background())
		_, _ = c.Exec(context.Background(), "DROP SCHEMA "+name+" CASCADE")
	})
	return withQuery(base, "search_path", name)
}

// MySQLDSN creates a fresh database, drops it when the test ends, and
// returns a go-sql-driver DSN for it (parseTime on).
func MySQLDSN(t testing.TB) string {
	t.Helper()
	base := env("IDEM_TEST_MYSQL", DefaultMySQL)
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL: %v", err)
	}
	dial(t, "MariaDB/MySQL", cfg.Addr)
	db, err := sql.Open("mysql", base)
	if err != nil {
		t.Fatalf("open mysql: %v", err)
	}
	defer db.Close()
	name := Name()
	if _, err := db.Exec("CREATE DATABASE " + name); err != nil {
		Unavailable(t, "MariaDB/MySQL", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("mysql", base)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP DATABASE " + name)
	})
	cfg.DBName = name
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// RedisURL returns the Redis URL after checking that the server answers.
// Tests isolate themselves with a key prefix from Name.
func RedisURL(t testing.TB) string {
	t.Helper()
	u := env("IDEM_TEST_REDIS", DefaultRedis)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("IDEM_TEST_REDIS: %v", err)
	}
	dial(t, "Redis", hostPort(pu, "6379"))
	return u
}

// NATSURL returns the NATS URL after checking that the server answers.
func NATSURL(t testing.TB) string {
	t.Helper()
	u := env("IDEM_TEST_NATS", DefaultNATS)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("IDEM_TEST_NATS: %v", err)
	}
	dial(t, "NATS", hostPort(pu, "4222"))
	return u
}

// AMQPURL returns the RabbitMQ URL after checking that the server answers.
func AMQPURL(t testing.TB) string {
	t.Helper()
	u := env("IDEM_TEST_AMQP", DefaultAMQP)
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatalf("IDEM_TEST_AMQP: %v", err)
	}
	dial(t, "RabbitMQ", hostPort(pu, "5672"))
	return u
}

func hostPort(u *url.URL, defPort string) string {
	if u.Port() != "" {
		return u.Host
	}
	return net.JoinHostPort(u.Hostname(), defPort)
}

func withQuery(raw, key, value string) string {
	sep := "?"
	if strings.Contains(raw, "?") {
		sep = "&"
	}
	return raw + sep + url.QueryEscape(key) + "=" + url.QueryEscape(value)
}

// RunExample runs an Example function that needs a real server and checks
// what it printed. Such examples carry no "// Output:" line, since go test
// would run them unconditionally and fail on a machine without the
// server; this runs them only after the caller's testenv check passed.
func RunExample(t *testing.T, example func(), want string) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		example()
	}()
	w.Close()
	got := <-done
	if strings.TrimSpace(got) != strings.TrimSpace(want) {
		t.Errorf("example printed:\n%s\nwant:\n%s", got, want)
	}
}
