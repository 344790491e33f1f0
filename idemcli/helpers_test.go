package idemcli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
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

// startServer builds the demo in-process on db and serves it on a
// loopback test server.
func startServer(t *testing.T, opts ServeOpts) (*server, *httptest.Server) {
	t.Helper()
	if opts.Lease == 0 {
		opts.Lease = 90 * time.Second
	}
	if opts.Retention == 0 {
		opts.Retention = 24 * time.Hour
	}
	s, err := newServer(context.Background(), &opts, testLogger(t))
	if err != nil {
		t.Fatalf("newServer(%s): %v", opts.DB, err)
	}
	ts := httptest.NewServer(s.handler)
	t.Cleanup(func() {
		ts.Close()
		s.conn.Close()
	})
	return s, ts
}

// testLogger sends the demo's logs to the test log, shown on failure.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// answer is one HTTP response, read whole.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a answer) String() string {
	if a.err != nil {
		return "error: " + a.err.Error()
	}
	return fmt.Sprintf("%d %s %q", a.status, a.header.Get("Content-Type"), bytes.TrimSpace(a.body))
}

func (a answer) replayed() bool { return a.header.Get("Idempotent-Replayed") == "true" }

// req describes one request to send.
type req struct {
	method, url, body string
	key, auth         string
	contentType       string
}

func (r req) build(ctx context.Context) (*http.Request, error) {
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	hr, err := http.NewRequestWithContext(ctx, r.method, r.url, body)
	if err != nil {
		return nil, err
	}
	if r.body != "" {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		hr.Header.Set("Content-Type", ct)
	}
	if r.key != "" {
		hr.Header.Set("Idempotency-Key", r.key)
	}
	if r.auth != "" {
		hr.Header.Set("Authorization", r.auth)
	}
	return hr, nil
}

func send(client *http.Client, r req) answer {
	hr, err := r.build(context.Background())
	if err != nil {
		return answer{err: err}
	}
	resp, err := client.Do(hr)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, header: resp.Header, body: body, err: err}
}

func do(t *testing.T, r req) answer {
	t.Helper()
	a := send(http.DefaultClient, r)
	if a.err != nil {
		t.Fatalf("%s %s: %v", r.method, r.url, a.err)
	}
	return a
}

// fireTogether sends every request at the same instant: each goroutine
// builds its request, then all wait on one barrier, released at once.
func fireTogether(reqs []req) []answer {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: len(reqs)}}
	defer client.CloseIdleConnections()
	answers := make([]answer, len(reqs))
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	for i, r := range reqs {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			hr, err := r.build(context.Background())
			ready.Done()
			if err != nil {
				answers[i] = answer{err: err}
				return
			}
			<-start
			resp, err := client.Do(hr)
			if err != nil {
				answers[i] = answer{err: err}
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			answers[i] = answer{status: resp.StatusCode, header: resp.Header, body: body, err: err}
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	return answers
}

// checkOneEffect checks the answers of duplicates sent together: exactly
// one fresh 201, and every other answer either a byte-identical replay of
// it with Idempotent-Replayed: true, or a 409 problem with Retry-After. It
// returns the fresh answer.
func checkOneEffect(t *testing.T, answers []answer) answer {
	t.Helper()
	var fresh []answer
	for _, a := range answers {
		if a.err != nil {
			t.Fatalf("request failed: %v", a.err)
		}
		if a.status == http.StatusCreated && !a.replayed() {
			fresh = append(fresh, a)
		}
	}
	if len(fresh) != 1 {
		t.Fatalf("%d fresh 201 answers, want exactly 1; answers:\n%s", len(fresh), listAnswers(answers))
	}
	first := fresh[0]
	replays, conflicts := 0, 0
	for _, a := range answers {
		switch {
		case a.status == http.StatusCreated && !a.replayed():
			// the fresh one
		case a.status == http.StatusCreated:
			replays++
			if !bytes.Equal(a.body, first.body) {
				t.Errorf("replay body %q differs from the first answer %q", a.body, first.body)
			}
			if a.header.Get("Location") != first.header.Get("Location") || a.header.Get("Content-Type") != first.header.Get("Content-Type") {
				t.Errorf("replay headers %v differ from the first answer's %v", a.header, first.header)
			}
		case a.status == http.StatusConflict:
			conflicts++
			if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("409 with Content-Type %q, want application/problem+json", ct)
			}
			if a.header.Get("Retry-After") == "" {
				t.Errorf("409 without Retry-After")
			}
		default:
			t.Errorf("unexpected answer %s", a)
		}
	}
	t.Logf("%d requests: 1 fresh 201, %d replays, %d conflicts", len(answers), replays, conflicts)
	return first
}

func listAnswers(answers []answer) string {
	var b strings.Builder
	for _, a := range answers {
		fmt.Fprintf(&b, "  %s replayed=%v\n", a, a.replayed())
	}
	return b.String()
}
