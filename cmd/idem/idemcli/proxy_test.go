package idemcli

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/idem-go/idem/internal/testenv"
)

// naiveUpstream is testdata/naiveorders.py running: a Python service
// that deduplicates by check-then-write with a gap.
type naiveUpstream struct {
	url string
	cmd *exec.Cmd
}

func startNaive(t *testing.T) *naiveUpstream {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if testenv.InCI() {
			t.Fatal("python3 is required")
		}
		t.Skip("skipping: no python3")
	}
	cmd := exec.Command(py, "testdata/naiveorders.py", "0")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // killed on purpose
	line, err := bufio.NewReader(out).ReadString('\n')
	var port int
	if _, serr := fmt.Sscanf(line, "listening %d", &port); err != nil || serr != nil {
		t.Fatalf("naiveorders.py did not start: %q %v", line, err)
	}
	return &naiveUpstream{url: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
}

type naiveOrder struct {
	ID  int     `json:"id"`
	Key *string `json:"key"`
}

// ordersFor counts the upstream's orders created under key.
func (u *naiveUpstream) ordersFor(t *testing.T, key string) int {
	t.Helper()
	resp, err := http.Get(u.url + "/orders")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var all []naiveOrder
	if err := json.NewDecoder(resp.Body).Decode(&all); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, o := range all {
		if o.Key != nil && *o.Key == key {
			n++
		}
	}
	return n
}

// received is how many POST /orders the upstream has seen.
func (u *naiveUpstream) received(t *testing.T) int {
	t.Helper()
	resp, err := http.Get(u.url + "/received")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v struct{ Received int }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	return v.Received
}

var proxyListening = regexp.MustCompile(`msg="proxy listening" addr=(\S+)`)

// proxyInProcess runs `idem proxy` with args in the test process until
// the test ends, and returns its URL.
func proxyInProcess(t *testing.T, args ...string) string {
	t.Helper()
	logs := &syncBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	finished := make(chan error, 1)
	go func() {
		finished <- runProxy(ctx, append([]string{"--addr", "127.0.0.1:0"}, args...), io.Discard, logs)
	}()
	t.Cleanup(func() {
		stop()
		select {
		case err := <-finished:
			if err != nil {
				t.Errorf("proxy stopped with %v", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("proxy did not stop")
		}
		if t.Failed() {
			t.Logf("proxy logs:\n%s", logs)
		}
	})
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := proxyListening.FindStringSubmatch(logs.String()); m != nil {
			return "http://" + m[1]
		}
		select {
		case err := <-finished:
			t.Fatalf("proxy ended before listening: %v\n%s", err, logs)
		default:
		}
	}
	t.Fatalf("proxy never listening:\n%s", logs)
	return ""
}

// idemCheck runs `idem check` against url/orders and returns its exit
// status and report.
func idemCheck(t *testing.T, base string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := idemcheck.Main(t.Context(), []string{
		"-d", `{"item":"book"}`, "-H", "Content-Type: application/json",
		"--count-url", base + "/orders", base + "/orders",
	}, &out, &out)
	return code, out.String()
}

// TestProxyNaiveUpstreamAloneFailsCheck: the Python service, alone,
// creates an order per concurrent duplicate, and idem check says so.
func TestProxyNaiveUpstreamAloneFailsCheck(t *testing.T) {
	up := startNaive(t)
	code, report := idemCheck(t, up.url)
	if code != 1 {
		t.Fatalf("idem check on the naive upstream alone exited %d, want 1 (a failed check):\n%s", code, report)
	}
	if !strings.Contains(report, "fail") {
		t.Fatalf("no failed check in the report:\n%s", report)
	}
}

// TestProxyNaiveUpstreamPassesCheck: behind idem proxy the same service
// passes idem check, and duplicates released at one barrier make exactly
// one order, on each kind of store.
func TestProxyNaiveUpstreamPassesCheck(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) []string
	}{
		{"SQLite", func(t *testing.T) []string { return []string{"--db", sqliteDB(t)} }},
		{"PostgreSQL", func(t *testing.T) []string { return []string{"--db", postgresDB(t)} }},
		{"Redis", func(t *testing.T) []string { return []string{"--keys", testenv.RedisURL(t)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := startNaive(t)
			base := proxyInProcess(t, append([]string{"--upstream", up.url, "--tenant", "shared", "--routes", "POST /orders"}, tc.store(t)...)...)
			if code, report := idemCheck(t, base); code != 0 {
				t.Fatalf("idem check through the proxy exited %d, want 0:\n%s", code, report)
			}
			const n = 16
			// Unique per run: Redis keeps the records of earlier runs.
			key := fmt.Sprintf("barrier-%s-%d", tc.name, time.Now().UnixNano())
			statuses := make([]int, n)
			atonce.Run(n, func(i int) {
				req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"item":"pen"}`))
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // only the status matters
				resp.Body.Close()
				statuses[i] = resp.StatusCode
				if resp.Header.Get("Idempotent-Replayed") == "true" {
					statuses[i] = -resp.StatusCode
				}
			})
			created := 0
			for _, s := range statuses {
				switch s {
				case http.StatusCreated:
					created++
				case http.StatusConflict, -http.StatusCreated:
				default:
					t.Errorf("a duplicate was answered %d", s)
				}
			}
			if created != 1 {
				t.Errorf("%d duplicates answered a fresh 201, want 1 (statuses, a replay negative: %v)", created, statuses)
			}
			if got := up.ordersFor(t, key); got != 1 {
				t.Errorf("the upstream made %d orders under the key, want 1", got)
			}
		})
	}
}

// TestProxyKilledMidRequest: kill -9 of the proxy while the upstream
// works on a request; the upstream finishes it, the key stays held by the
// dead proxy's lease (409 from the proxy restarted on the same store),
// and once the lease has ended the retry goes through to the upstream.
func TestProxyKilledMidRequest(t *testing.T) {
	bin := idemBinary(t)
	up := startNaive(t)
	db := sqliteDB(t)
	const lease = 2 * time.Second
	start := func() (*exec.Cmd, string) {
		cmd := exec.Command(bin, "proxy", "--addr", "127.0.0.1:0", "--upstream", up.url, "--tenant", "shared",
			"--db", db, "--lease", lease.String())
		stderr, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() }) //nolint:errcheck // killed on purpose
		addr := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				if m := proxyListening.FindStringSubmatch(sc.Text()); m != nil {
					addr <- m[1]
				}
			}
		}()
		select {
		case a := <-addr:
			return cmd, "http://" + a
		case <-time.After(2 * time.Minute):
			t.Fatal("the proxy never listened")
			return nil, ""
		}
	}
	post := func(base string) (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, base+"/orders?delay=1", strings.NewReader(`{"item":"lamp"}`))
		req.Header.Set("Idempotency-Key", "killed")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body) //nolint:errcheck // status only
			resp.Body.Close()
		}
		return resp, err
	}

	first, base := start()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := post(base); err == nil {
			t.Error("the request through the killed proxy got an answer")
		}
	}()
	for deadline := time.Now().Add(time.Minute); up.received(t) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream never received the request")
		}
	}
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.Wait() //nolint:errcheck // killed
	wg.Wait()

	_, base = start()
	resp, err := post(base)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("a retry while the dead proxy's lease runs was answered %d, want 409", resp.StatusCode)
	}
	if n := up.received(t); n != 1 {
		t.Fatalf("the upstream received %d requests, want 1: the held key must not reach it", n)
	}
	var status int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		resp, err := post(base)
		if err != nil {
			t.Fatal(err)
		}
		if status = resp.StatusCode; status != http.StatusConflict {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key was never taken over")
		}
	}
	// The retry reached the upstream, with the same key: this one found
	// its first order and answered it (200), making no second one.
	if n := up.received(t); n != 2 {
		t.Errorf("the upstream received %d requests, want 2 (the killed one, the retry after the lease)", n)
	}
	if status != http.StatusOK {
		t.Errorf("the retry after the lease was answered %d, want the upstream's 200 for the key it knows", status)
	}
	if n := up.ordersFor(t, "killed"); n != 1 {
		t.Errorf("%d orders under the key, want 1", n)
	}
}

// TestProxyGracefulShutdown: a request in flight when the proxy is told
// to stop (SIGTERM's path) is answered, and its answer stored: the proxy
// started again on the same store replays it.
func TestProxyGracefulShutdown(t *testing.T) {
	up := startNaive(t)
	db := sqliteDB(t)
	logs := &syncBuffer{}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	finished := make(chan error, 1)
	go func() {
		finished <- runProxy(ctx, []string{"--addr", "127.0.0.1:0", "--upstream", up.url, "--tenant", "shared", "--db", db}, io.Discard, logs)
	}()
	var base string
	for deadline := time.Now().Add(time.Minute); base == ""; time.Sleep(10 * time.Millisecond) {
		if m := proxyListening.FindStringSubmatch(logs.String()); m != nil {
			base = "http://" + m[1]
		} else if time.Now().After(deadline) {
			t.Fatalf("never listening:\n%s", logs)
		}
	}
	post := func(base string) (int, bool) {
		req, _ := http.NewRequest(http.MethodPost, base+"/orders?delay=1", strings.NewReader(`{"item":"desk"}`))
		req.Header.Set("Idempotency-Key", "graceful")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, false
		}
		io.Copy(io.Discard, resp.Body) //nolint:errcheck // status only
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
	}
	answered := make(chan int, 1)
	go func() { s, _ := post(base); answered <- s }()
	for deadline := time.Now().Add(time.Minute); up.received(t) == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream never received the request")
		}
	}
	stop()
	if s := <-answered; s != http.StatusCreated {
		t.Fatalf("the request in flight at shutdown was answered %d, want 201", s)
	}
	if err := <-finished; err != nil {
		t.Fatalf("the proxy stopped with %v:\n%s", err, logs)
	}
	again := proxyInProcess(t, "--upstream", up.url, "--tenant", "shared", "--db", db)
	if s, replayed := post(again); s != http.StatusCreated || !replayed {
		t.Fatalf("the retry on the restarted proxy: %d replayed=%v, want the stored 201 replayed", s, replayed)
	}
	if n := up.received(t); n != 1 {
		t.Errorf("the upstream received %d requests, want 1", n)
	}
}

// TestProxyFlagsRefused: the tenant rule and the store have no default.
func TestProxyFlagsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--db", "sqlite::memory:"}, "--upstream is required"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--db", "sqlite::memory:"}, "--tenant is required"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--tenant", "shared"}, "--db or --keys is required"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--tenant", "header:", "--db", "sqlite::memory:"}, "needs a header name"},
		{[]string{"--upstream", "http://u:p@127.0.0.1:1", "--tenant", "shared", "--db", "sqlite::memory:"}, "no credentials"},
		{[]string{"--upstream", "http://127.0.0.1:1", "--tenant", "shared", "--db", sqliteDB(t), "--routes", "/orders"}, "METHOD /path"},
	} {
		t.Setenv(tenantSecretEnv, "")
		err := runProxy(t.Context(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
	err := runProxy(t.Context(), []string{"--upstream", "http://127.0.0.1:1", "--tenant", "bearer", "--db", "sqlite::memory:"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "needs a secret") {
		t.Errorf("--tenant bearer without a secret: %v", err)
	}
}

// TestProxySQLiteSynchronous: the proxy's SQLite records commit with
// synchronous = NORMAL unless --sqlite-synchronous says FULL, on every
// connection of the pool; a bad value is refused on one line.
func TestProxySQLiteSynchronous(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  int
	}{{nil, 1}, {[]string{"--sqlite-synchronous", "FULL"}, 2}, {[]string{"--sqlite-synchronous", "normal"}, 1}} {
		args := append([]string{"--upstream", "http://127.0.0.1:1", "--tenant", "shared", "--db", sqliteDB(t)}, tc.flags...)
		o, err := parseProxyFlags(args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := o.check(); err != nil {
			t.Fatal(err)
		}
		c, _, err := o.openStore(t.Context(), slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		conns := make([]*sql.Conn, idemsqlite.MaxOpenConns)
		for i := range conns {
			if conns[i], err = c.db.Conn(t.Context()); err != nil {
				t.Fatal(err)
			}
			var got int
			if err := conns[i].QueryRowContext(t.Context(), `PRAGMA synchronous`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("%q: connection %d has synchronous %d, want %d", tc.flags, i, got, tc.want)
			}
		}
		for _, conn := range conns {
			conn.Close()
		}
		c.Close()
	}

	// The other commands (idem serve) keep idemsqlite.Open's FULL.
	c, err := openDB(t.Context(), sqliteDB(t), openOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got int
	if err := c.db.QueryRowContext(t.Context(), `PRAGMA synchronous`).Scan(&got); err != nil || got != 2 {
		t.Errorf("openDB without sqliteSynchronous: synchronous %d (%v), want 2 (FULL)", got, err)
	}
	c.Close()

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sqlite-synchronous", "OFF", "--db", sqliteDB(t)}, `idem proxy: --sqlite-synchronous must be NORMAL or FULL, got "OFF"` + "\n"},
		{[]string{"--sqlite-synchronous", "FULL", "--keys", "redis://127.0.0.1:1/0"}, "idem proxy: --sqlite-synchronous applies to --db sqlite: only\n"},
	} {
		code, _, errOut := run(append([]string{"proxy", "--upstream", "http://127.0.0.1:1", "--tenant", "shared"}, tc.args...)...)
		if code != ExitUsage || errOut != tc.want {
			t.Errorf("%q: exit %d, stderr %q; want exit %d, %q", tc.args, code, errOut, ExitUsage, tc.want)
		}
	}
}
