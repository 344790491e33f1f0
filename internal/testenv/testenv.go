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
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
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
// server answers. IDEM_TEST_POSTGRES must be a URL (postgres://…).
func PostgresURL(t testing.TB) string {
	t.Helper()
	u := env("IDEM_TEST_POSTGRES", DefaultPostgres)
	pu, err := url.Parse(u)
	if err != nil || (pu.Scheme != "postgres" && pu.Scheme != "postgresql") {
		t.Fatalf("IDEM_TEST_POSTGRES must be a postgres:// URL: %q", u)
	}
	dial(t, "PostgreSQL", hostPort(pu, "5432"))
	return u
}

// PostgresSchema creates a fresh schema, drops it when the test ends, and
// returns a URL whose connections use it as search_path. Tests sharing the
// database therefore never see each other's tables.
//
// It talks to the server through database/sql's "pgx" driver, which the
// calling test registers (import _ "github.com/jackc/pgx/v5/stdlib"), so
// that this package, shared by every module, imports no driver.
func PostgresSchema(t testing.TB) string {
	t.Helper()
	base := PostgresURL(t)
	name := Name()
	db := openDriver(t, "pgx", base, "PostgreSQL", `import _ "github.com/jackc/pgx/v5/stdlib"`)
	defer db.Close()
	if _, err := db.Exec("CREATE SCHEMA " + name); err != nil {
		Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("pgx", base)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec("DROP SCHEMA " + name + " CASCADE")
	})
	return withQuery(base, "search_path", name)
}

// MySQLDSN creates a fresh database, drops it when the test ends, and
// returns a go-sql-driver DSN for it (parseTime on). It talks to the
// server through database/sql's "mysql" driver, which the calling test
// registers (import _ "github.com/go-sql-driver/mysql").
func MySQLDSN(t testing.TB) string {
	t.Helper()
	base := env("IDEM_TEST_MYSQL", DefaultMySQL)
	d, err := parseMySQLDSN(base)
	if err != nil {
		t.Fatalf("IDEM_TEST_MYSQL: %v", err)
	}
	dial(t, "MariaDB/MySQL", d.addr)
	db := openDriver(t, "mysql", base, "MariaDB/MySQL", `import _ "github.com/go-sql-driver/mysql"`)
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
	return d.withDatabase(name)
}

// openDriver opens dsn with a driver the calling test must have
// registered, and fails the test with the import to add when it has not.
func openDriver(t testing.TB, driver, dsn, service, hint string) *sql.DB {
	t.Helper()
	if !slices.Contains(sql.Drivers(), driver) {
		t.Fatalf("testenv: the %q database/sql driver is not registered; the test must %s", driver, hint)
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		t.Fatalf("open %s: %v", service, err)
	}
	return db
}

// mysqlDSN is a go-sql-driver DSN cut at its database name:
// [user[:password]@][net[(addr)]]/dbname[?params].
type mysqlDSN struct {
	head   string // up to and including the "/" before the database name
	params string // after "?", without it
	addr   string // host:port of a tcp address
}

func parseMySQLDSN(dsn string) (mysqlDSN, error) {
	var d mysqlDSN
	slash := -1
	if i := strings.LastIndex(dsn, ")/"); i >= 0 {
		slash = i + 1
	} else if i := strings.Index(dsn[strings.LastIndex(dsn, "@")+1:], "/"); i >= 0 {
		slash = strings.LastIndex(dsn, "@") + 1 + i
	}
	if slash < 0 {
		return d, fmt.Errorf("no /dbname in %q", dsn)
	}
	d.head = dsn[:slash+1]
	if q := strings.IndexByte(dsn[slash:], '?'); q >= 0 {
		d.params = dsn[slash+q+1:]
	}
	d.addr = "127.0.0.1:3306"
	if o := strings.Index(d.head, "tcp("); o >= 0 {
		if c := strings.IndexByte(d.head[o:], ')'); c > 0 {
			d.addr = d.head[o+len("tcp(") : o+c]
		}
	}
	return d, nil
}

// withDatabase returns the DSN naming database name, with parseTime on.
func (d mysqlDSN) withDatabase(name string) string {
	params := d.params
	if !strings.Contains(params, "parseTime=") {
		if params != "" {
			params += "&"
		}
		params += "parseTime=true"
	}
	return d.head + name + "?" + params
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
