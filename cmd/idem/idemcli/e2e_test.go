package idemcli

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/demo"
	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBinary()
	os.Exit(code)
}

// idemBinary builds cmd/idem as a user would (go build), once.
func idemBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping: builds the idem binary and starts it (-short)")
	}
	return testenv.IdemBinary(t)
}

// proc is a running `idem serve`.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	url    string
	mu     sync.Mutex
	logs   strings.Builder
	addr   chan string // receives the address from the "listening" line
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

var listeningAddr = regexp.MustCompile(`msg=listening addr=(\S+)`)

// startServe starts `idem serve` with args on a free loopback port and
// waits until it listens.
func startServe(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := launchServe(t, name, args...)
	p.waitReady()
	return p
}

// launchServe starts `idem serve` with args on a free loopback port
// without waiting for it.
func launchServe(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(idemBinary(t), append([]string{"serve", "--addr", "127.0.0.1:0"}, args...)...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, addr: make(chan string, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			if m := listeningAddr.FindStringSubmatch(line); m != nil {
				p.addr <- m[1]
			}
		}
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s logs:\n%s", name, p.log())
		}
	})
	return p
}

// waitReady waits for the "listening" log line, written once the socket
// accepts connections.
func (p *proc) waitReady() {
	p.t.Helper()
	select {
	case a := <-p.addr:
		p.url = "http://" + a
	case <-p.exited:
		p.t.Fatalf("%s exited before listening (%v):\n%s", p.name, p.err, p.log())
	case <-time.After(2 * time.Minute):
		p.t.Fatalf("%s did not listen within 2 minutes:\n%s", p.name, p.log())
	}
}

// stop sends SIGTERM and checks for a clean shutdown: exit status 0 after
// the "stopped" log line.
func (p *proc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatalf("signal %s: %v", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(2 * time.Minute):
		p.t.Fatalf("%s did not stop after SIGTERM:\n%s", p.name, p.log())
	}
	if p.err != nil {
		p.t.Fatalf("%s exited with %v after SIGTERM:\n%s", p.name, p.err, p.log())
	}
	if !strings.Contains(p.log(), "msg=stopped") {
		p.t.Fatalf("%s exited without logging a clean stop:\n%s", p.name, p.log())
	}
}

// countOrders counts the default tenant's orders for cartID in a SQLite
// file, read directly.
func countOrders(db *sql.DB, cartID string) (int, error) {
	var n int
	err := db.QueryRow(`SELECT COUNT(*) FROM `+demo.Table+` WHERE tenant_id = ? AND cart_id = ?`, defaultTenant, cartID).Scan(&n)
	return n, err
}

// TestServeDuplicatesAtOnce fires duplicates at once against
// the real binary on a SQLite file: parallel POSTs with one key, released
// together, then exactly one order for the cart.
func TestServeDuplicatesAtOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path)

	reqs := make([]Req, 20)
	for i := range reqs {
		reqs[i] = Req{Method: "POST", URL: p.url + "/orders", Body: GoodOrder, Key: "e2e-seed-key"}
	}
	first := CheckOneEffect(t, FireTogether(reqs))
	created := DecodeOrder(t, first)

	got := ListOrders(t, p.url, "c_42")
	if len(got) != 1 || got[0].ID != created.ID {
		t.Fatalf("orders for c_42: %+v, want exactly %s", got, created.ID)
	}
	// A retry after the fact is a replay of the same bytes.
	again := Do(t, reqs[0])
	if again.Status != http.StatusCreated || !again.Replayed() || string(again.Body) != string(first.Body) {
		t.Fatalf("late retry: %s replayed=%v, want the first answer replayed", again, again.Replayed())
	}
	p.stop()

	// Count in the file itself, after the server is gone.
	db, err := idemsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if n, err := countOrders(db, "c_42"); err != nil || n != 1 {
		t.Fatalf("%d orders in the SQLite file (%v), want 1", n, err)
	}
}

// TestServeTwoProcesses is the multi-process proof: two `idem serve`
// processes on one database, 50 requests with one key split across both
// and released together, exactly one order. Repeated with fresh keys. On
// PostgreSQL (pgx, idempg) and MariaDB (database/sql, idemsql).
func TestServeTwoProcesses(t *testing.T) {
	for _, kind := range dbKinds[1:] {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.fresh(t)
			// Both start at once: their migrations (orders and keys) must
			// wait for each other rather than fail.
			a := launchServe(t, "serve A", "--db", db)
			b := launchServe(t, "serve B", "--db", db)
			a.waitReady()
			b.waitReady()

			for round := range 4 {
				key := fmt.Sprintf("mp-key-%d", round)
				cart := fmt.Sprintf("mp-cart-%d", round)
				body := fmt.Sprintf(`{"cart_id":%q,"total_cents":%d}`, cart, 1000+round)
				reqs := make([]Req, 50)
				for i := range reqs {
					base := a.url
					if i%2 == 1 {
						base = b.url
					}
					reqs[i] = Req{Method: "POST", URL: base + "/orders", Body: body, Key: key}
				}
				first := CheckOneEffect(t, FireTogether(reqs))
				created := DecodeOrder(t, first)
				for _, p := range []*proc{a, b} {
					if got := ListOrders(t, p.url, cart); len(got) != 1 || got[0].ID != created.ID {
						t.Fatalf("round %d: %s lists %+v, want exactly %s", round, p.name, got, created.ID)
					}
				}
				if kind.name == "postgres" {
					// And in the table itself, across tenants.
					conn, err := pgx.Connect(context.Background(), db)
					if err != nil {
						t.Fatal(err)
					}
					var n int
					err = conn.QueryRow(context.Background(), `SELECT count(*) FROM `+demo.Table+` WHERE cart_id = $1`, cart).Scan(&n)
					conn.Close(context.Background())
					if err != nil || n != 1 {
						t.Fatalf("round %d: %d orders in PostgreSQL (%v), want 1", round, n, err)
					}
				}
			}
			a.stop()
			b.stop()
		})
	}
}

// TestServeShutdownFinishesRequests: SIGTERM while a request sleeps in its
// transaction lets it finish: the client gets its 201, the order and the
// stored answer are committed, and the process exits 0.
func TestServeShutdownFinishesRequests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path, "--handler-delay", "5s") // long enough for idem inspect to start on a busy machine
	db, err := idemsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store := testenv.Must(idemsql.NewStore(db, idemsql.SQLite))

	answered := make(chan Answer, 1)
	r := Req{Method: "POST", URL: p.url + "/orders", Body: GoodOrder, Key: "shutdown-key"}
	go func() { answered <- Send(http.DefaultClient, r) }()
	for i := 0; ; i++ {
		rec, err := store.Get(context.Background(), defaultTenant, "shutdown-key")
		if err == nil && rec.State == idem.StateInFlight {
			break
		}
		if i == 1000 {
			t.Fatalf("the request never got in flight: %+v, %v", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The operator's view of it, from another process, while the handler
	// holds SQLite's write lock: in flight, under a live lease.
	out, err := exec.Command(idemBinary(t), "inspect", "--db", "sqlite:"+path, "--key", "shutdown-key").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "state         in flight (retries get 409") {
		t.Fatalf("idem inspect of the key in flight: %v\n%s", err, out)
	}
	p.stop() // waits for the exit; stop checks status 0 and the "stopped" line
	a := <-answered
	if a.Err != nil || a.Status != http.StatusCreated {
		t.Fatalf("the request in flight at SIGTERM got %s, want 201", a)
	}
	rec, err := store.Get(context.Background(), defaultTenant, "shutdown-key")
	if err != nil || rec.State != idem.StateComplete {
		t.Fatalf("record after shutdown: %+v, %v; want complete", rec, err)
	}
	if n, err := countOrders(db, "c_42"); err != nil || n != 1 {
		t.Fatalf("%d orders after shutdown (%v), want 1", n, err)
	}
}

// TestCheckAgainstServe points `idem check` at `idem serve`: the demo
// passes every check, counted through GET /orders.
func TestCheckAgainstServe(t *testing.T) {
	p := startServe(t, "idem serve", "--db", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
	cmd := exec.Command(idemBinary(t), "check",
		"-d", `{"cart_id":"c_check","total_cents":1900}`, "-H", "Content-Type: application/json",
		"--count-url", p.url+"/orders?cart_id=c_check", p.url+"/orders")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("idem check: %v\n%s", err, out)
	}
	// Its "resources per key" check counts the orders through
	// --count-url: one per key.
	if !regexp.MustCompile(`PASS: \d+ passed, 0 warnings, 0 failed, 0 skipped`).Match(out) {
		t.Fatalf("idem check did not pass every check:\n%s", out)
	}
	p.stop()
}

// TestServePurgesInBackground: with --purge-interval, the janitor deletes
// records once their retention has passed. The engine never lets a record
// expire before its lease ends, so the lease is short too.
func TestServePurgesInBackground(t *testing.T) {
	path := filepath.Join(t.TempDir(), "idem.db")
	p := startServe(t, "idem serve", "--db", "sqlite:"+path, "--lease", "100ms", "--retention", "200ms", "--purge-interval", "50ms")
	if a := Do(t, Req{Method: "POST", URL: p.url + "/orders", Body: GoodOrder, Key: "short-lived"}); a.Status != http.StatusCreated {
		t.Fatalf("POST: %s", a)
	}
	db, err := idemsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	store := testenv.Must(idemsql.NewStore(db, idemsql.SQLite))
	// The 201 came after the record's commit; the record may be gone
	// already by the time the test looks (its retention is short, the
	// machine may be slow). Get reads the row, expired or not, and only
	// the janitor deletes a complete record: its absence is the purge.
	for i := 0; ; i++ {
		_, err := store.Get(context.Background(), defaultTenant, "short-lived")
		if errors.Is(err, idem.ErrNotFound) {
			break
		}
		if i == 1000 {
			t.Fatalf("the record was never purged: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The janitor logs its pass once its delete has committed: the line
	// may still be on its way, and a stop now could end the pass before
	// it logs, so wait for it first.
	for i := 0; !strings.Contains(p.log(), `purged expired records" deleted=1`); i++ {
		if i == 1000 {
			t.Fatalf("the janitor did not log its deletion:\n%s", p.log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.stop()
}

// TestReleaseBuildHasNoFaultHook: the binary users build has no crash
// injection: with IDEM_FAULT set, the request carrying the key is served,
// the process lives on and says why.
func TestReleaseBuildHasNoFaultHook(t *testing.T) {
	t.Setenv("IDEM_FAULT", "after-claim")
	t.Setenv("IDEM_FAULT_KEY", "fault-key")
	p := startServe(t, "idem serve", "--db", sqliteDB(t))
	a := Do(t, Req{Method: "POST", URL: p.url + "/orders", Body: GoodOrder, Key: "fault-key"})
	if a.Status != http.StatusCreated {
		t.Fatalf("the request carrying IDEM_FAULT_KEY: %s, want 201", a)
	}
	if !strings.Contains(p.log(), "no crash injection") {
		t.Errorf("no warning that IDEM_FAULT is ignored:\n%s", p.log())
	}
	p.stop()
}

// TestRedisErrorIsOneLine: an unreachable --keys gives one line on
// stderr, idem's; go-redis's own logger, which writes to the process's
// stderr, says nothing.
func TestRedisErrorIsOneLine(t *testing.T) {
	bin := idemBinary(t)
	for _, args := range [][]string{
		{"inspect", "--key", "k", "--keys", "redis://127.0.0.1:1/0"},
		{"serve", "--db", sqliteDB(t), "--keys", "redis://127.0.0.1:1/0", "--addr", "127.0.0.1:0"},
	} {
		var stdout, stderr strings.Builder
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != ExitFailure {
			t.Fatalf("idem %s: %v, want exit %d", strings.Join(args, " "), err, ExitFailure)
		}
		lines := strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n")
		last := lines[len(lines)-1]
		if !strings.HasPrefix(last, "idem "+args[0]+": cannot reach Redis at 127.0.0.1:1") || strings.Contains(stderr.String(), "redis: ") {
			t.Errorf("idem %s: stderr\n%s\nwant idem's line and nothing from go-redis", strings.Join(args, " "), stderr.String())
		}
		if args[0] == "inspect" && len(lines) != 1 {
			t.Errorf("idem inspect: %d lines on stderr, want 1:\n%s", len(lines), stderr.String())
		}
	}
}
