package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // testenv.PostgresSchema talks through database/sql

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/testenv"
)

// envChild carries, as a JSON array, the arguments of a payments server
// that the test binary runs instead of its tests: the tests that kill the
// server start it as a process of its own that way.
const envChild = "PAYMENTS_TEST_CHILD_ARGS"

func TestMain(m *testing.M) {
	if a := os.Getenv(envChild); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			fmt.Fprintln(os.Stderr, "payments test child:", err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
		err := run(ctx, args, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "payments test child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testDB is a private schema on the test's PostgreSQL.
type testDB struct {
	url  string // its URL, for a server
	pool *pgxpool.Pool
}

// database gives the test a schema of its own, with the payments and idem
// tables, dropped when the test ends.
func database(t *testing.T) testDB {
	t.Helper()
	url := testenv.PostgresSchema(t)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return testDB{url: url, pool: pool}
}

// startNetwork serves a card network over HTTP on the loopback.
func startNetwork(t *testing.T, config *cardnet.Config) (*cardnet.Network, string) {
	t.Helper()
	n := cardnet.New(config)
	srv := httptest.NewServer(n)
	t.Cleanup(srv.Close)
	return n, srv.URL
}

// startAPI serves the payments API in this process, as main does, and
// returns its base URL.
func startAPI(t *testing.T, c serverConfig) string {
	t.Helper()
	if c.logger == nil {
		w := &testWriter{t: t}
		// Registered before the server's cleanup, so run after it: the
		// server logs until it has shut down.
		t.Cleanup(w.close)
		c.logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	ctx := context.Background()
	s, err := newServer(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- serveUntil(serveCtx, s, ln) }()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Logf("shutdown: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}

// testWriter sends a server's log lines to the test's log, until the test
// ends.
type testWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *testWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

// downstreamKey is idem.DownstreamKey(ctx, step) as the handler computes
// it for the call c: the key the card network sees. It is bound to the
// request's fingerprint, so it is taken from c sent, as the client sends
// it, through idemhttp and the API's routes, on an engine over idemmem.
func downstreamKey(t *testing.T, c apiCall, step string) string {
	t.Helper()
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close(context.Background())
	mw, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{TenantFunc: tenant})
	if err != nil {
		t.Fatal(err)
	}
	var dk string
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dk = idem.DownstreamKey(r.Context(), step)
		w.WriteHeader(http.StatusCreated)
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(h))
	mux.Handle("POST /payments/{id}/refunds", authenticate(h))
	body, err := json.Marshal(c.body)
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest(http.MethodPost, c.path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.merchant)
	req.Header.Set("Idempotency-Key", c.key)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated || dk == "" {
		t.Fatalf("downstream key of %s/%s: %q, answer %d %s", c.merchant, c.key, dk, rec.Code, rec.Body)
	}
	return dk
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// record is what idem stored for a key.
type record struct {
	state    string
	status   int
	body     []byte
	hasSteps bool
}

// records reads idem's records of merchant, by key.
func records(t *testing.T, pool *pgxpool.Pool, merchant string) map[string]record {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT idem_key, state, coalesce(status_code, 0), coalesce(response_body, ''), coalesce(length(steps), 0) > 0
		FROM idem_keys WHERE tenant_id = $1`, merchant)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]record{}
	for rows.Next() {
		var k string
		var r record
		if err := rows.Scan(&k, &r.state, &r.status, &r.body, &r.hasSteps); err != nil {
			t.Fatal(err)
		}
		out[k] = r
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// child is the payments server run as a process of its own, to be killed.
type child struct {
	t    *testing.T
	args []string
	addr string
	cmd  *exec.Cmd
	log  *lockedBuffer
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// freeAddr returns a loopback address no one listens on, for a server that
// must come back on the same address after it is killed.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// startChild runs the test binary as a payments server with args (and
// -listen addr), and waits until it answers.
func startChild(t *testing.T, addr string, args ...string) *child {
	t.Helper()
	c := &child{t: t, addr: addr, args: append([]string{"-listen", addr}, args...), log: &lockedBuffer{}}
	c.start()
	t.Cleanup(func() {
		c.kill()
		if t.Failed() {
			t.Logf("server log:\n%s", c.log.String())
		}
	})
	return c
}

func (c *child) start() {
	c.t.Helper()
	a, _ := json.Marshal(c.args)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+string(a))
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.cmd = cmd
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + c.addr + "/healthz")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the payments server did not come up on %s: %v\n%s", c.addr, err, c.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (c *child) kill() {
	if c.cmd == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	_ = c.cmd.Wait()
	c.cmd = nil
}
