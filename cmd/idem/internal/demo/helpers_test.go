package demo

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" database/sql driver
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// backend is a fresh database of one kind: the handle the orders use and
// the key store on the same database, so that both commit together.
type backend struct {
	cfg   Config // DB and Dialect, or Pool
	store idem.Store
}

// kinds are the databases the demo runs on, each a function returning a
// fresh one for one test.
var kinds = []struct {
	name string
	open func(t *testing.T) backend
}{
	{"sqlite", sqliteBackend},
	{"postgres", postgresBackend},
	{"mysql", mysqlBackend},
}

func sqliteBackend(t *testing.T) backend {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(context.Background(), db, idemmigrate.SQLite); err != nil {
		t.Fatal(err)
	}
	return backend{cfg: Config{DB: db, Dialect: SQLite}, store: testenv.Must(idemsql.NewStore(db, idemsql.SQLite))}
}

func postgresBackend(t *testing.T) backend {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.PostgresSchema(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(context.Background(), pool); err != nil {
		t.Fatal(err)
	}
	return backend{cfg: Config{Pool: pool}, store: testenv.Must(idempg.NewStore(pool, nil))}
}

func mysqlBackend(t *testing.T) backend {
	t.Helper()
	db, err := sql.Open("mysql", testenv.MySQLDSN(t)) // parseTime on
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := idemmigrate.Migrate(context.Background(), db, idemmigrate.MySQL); err != nil {
		t.Fatal(err)
	}
	return backend{cfg: Config{DB: db, Dialect: MySQL}, store: testenv.Must(idemsql.NewStore(db, idemmysql.Dialect))}
}

// server is the demo in-process on a loopback test server.
type server struct {
	app   *App
	store idem.Store
	url   string
	logs  *syncBuffer
	// stopHard ends the requests still running after their clients went
	// away (Config.ShutdownContext), as a server stopping at once does.
	stopHard context.CancelFunc
}

// start builds the demo on b (its settings changed by mod, when given)
// and serves it.
func start(t *testing.T, b backend, mod func(*Config)) *server {
	t.Helper()
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	engine, err := idem.NewEngine(b.store, &idem.Config{Lease: 90 * time.Second, Retention: 24 * time.Hour, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	hardStop, stopHard := context.WithCancel(context.Background())
	cfg := b.cfg
	cfg.Engine = engine
	cfg.Logger = logger
	cfg.ShutdownContext = hardStop
	if mod != nil {
		mod(&cfg)
	}
	app, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(app.Handler())
	t.Cleanup(func() {
		stopHard()
		ts.Close()
		engine.Close(context.Background())
		if t.Failed() {
			t.Logf("server logs:\n%s", logs)
		}
	})
	return &server{app: app, store: b.store, url: ts.URL, logs: logs, stopHard: stopHard}
}

// count returns how many orders tenant has for cartID.
func (s *server) count(t *testing.T, tenant, cartID string) int {
	t.Helper()
	n, err := s.app.repo.count(context.Background(), tenant, cartID)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitRecord polls the record of key (default tenant) until ok says so.
// It bounds the wait by a count of polls, not by asserting a duration.
func (s *server) waitRecord(t *testing.T, key string, ok func(*idem.Record, error) bool) {
	t.Helper()
	var rec *idem.Record
	var err error
	for range 3000 {
		rec, err = s.store.Get(context.Background(), DefaultTenant, key)
		if ok(rec, err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("record %q never reached the expected state: %+v, %v", key, rec, err)
}

// syncBuffer is a log sink the test reads while the server writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// lines returns the log lines holding substr.
func (s *syncBuffer) lines(substr string) []string {
	var out []string
	for _, l := range strings.Split(s.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}
