package idemcli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem/internal/testenv"
)

// dbKinds are the databases the demo runs on, each a function returning a
// fresh --db value for one test.
var dbKinds = []struct {
	name  string
	fresh func(t *testing.T) string
}{
	{"sqlite", sqliteDB},
	{"postgres", postgresDB},
	{"mysql", mysqlDB},
}

func sqliteDB(t *testing.T) string {
	return "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
}

func postgresDB(t *testing.T) string { return testenv.PostgresSchema(t) }

// mysqlDB turns testenv's go-sql-driver DSN back into the mysql:// URL
// that --db takes, so that the translation is exercised too.
func mysqlDB(t *testing.T) string {
	cfg, err := mysql.ParseDSN(testenv.MySQLDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("mysql://%s@%s/%s", cfg.User, cfg.Addr, cfg.DBName)
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

// inProcess is `idem serve` running in the test process.
type inProcess struct {
	addr     string
	logs     *syncBuffer
	stop     context.CancelFunc // ends run's context, as SIGTERM does
	finished chan struct{}      // closed when run has returned
	err      error              // run's result, once finished is closed
}

var listeningLine = regexp.MustCompile(`msg=listening addr=(\S+)`)

// serveInProcess runs serve with opts (on a free loopback port) until the
// test ends or stop is called, and waits until it listens.
func serveInProcess(t *testing.T, opts serveOpts) *inProcess {
	t.Helper()
	opts.addr = "127.0.0.1:0"
	if opts.lease == 0 {
		opts.lease = 90 * time.Second
	}
	if opts.retention == 0 {
		opts.retention = 24 * time.Hour
	}
	if opts.readTimeout == 0 {
		opts.readTimeout = defaultReadTimeout
	}
	if opts.idleTimeout == 0 {
		opts.idleTimeout = defaultIdleTimeout
	}
	ctx, stop := context.WithCancel(context.Background())
	p := &inProcess{logs: &syncBuffer{}, stop: stop, finished: make(chan struct{})}
	go func() {
		defer close(p.finished)
		s := &serveCmd{CommandBase{Logger: slog.New(slog.NewTextHandler(p.logs, nil))}}
		p.err = s.run(ctx, &opts)
	}()
	t.Cleanup(func() {
		stop()
		select {
		case <-p.finished:
		case <-time.After(time.Minute):
			t.Errorf("serve did not stop:\n%s", p.logs)
		}
		if t.Failed() {
			t.Logf("serve logs:\n%s", p.logs)
		}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if m := listeningLine.FindStringSubmatch(p.logs.String()); m != nil {
			p.addr = m[1]
			return p
		}
		select {
		case <-p.finished:
			t.Fatalf("serve ended before listening: %v\n%s", p.err, p.logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("never listening:\n%s", p.logs)
		}
	}
}

// wait stops the server (as SIGTERM does) and returns run's result.
func (p *inProcess) wait(t *testing.T) error {
	t.Helper()
	p.stop()
	select {
	case <-p.finished:
		return p.err
	case <-time.After(time.Minute):
		t.Fatalf("serve did not return:\n%s", p.logs)
		return nil
	}
}
