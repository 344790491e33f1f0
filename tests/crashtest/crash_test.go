package crashtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, to read the PostgreSQL schema

	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemsql/idemsqlite"
	"github.com/idem-go/idem/internal/testenv"
)

// iterations is per kill point per store. The default keeps the CI run
// short; the recorded run in docs/RELIABILITY.md uses 50.
var iterations = flag.Int("crashtest.iterations", 3, "iterations per kill point per store")

// The kill points of cmd/idem/internal/demo/faultpoints.go, in request order.
var points = []string{"after-claim", "after-write", "after-commit"}

const (
	// lease is --lease: short, so that a retry may take over the key of
	// a dead execution within the test's time. Retries meeting the key in
	// flight get 409 with Retry-After: 1 (whole seconds), so about one
	// 409 round separates the restart from the takeover.
	lease  = "1s"
	tenant = "crashtest"
	// A restarted server is up in well under a second; these bound what
	// a broken build or a hung process can cost before the test says so.
	startTimeout  = time.Minute
	dieTimeout    = 30 * time.Second
	clientTimeout = 2 * time.Minute
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBinary()
	os.Exit(code)
}

// idemBinary builds cmd/idem as a user would, once, with the build tag
// idemfaults that compiles the crash hook in (release builds have none):
// the crash must kill a real process, whose open transactions and sockets
// the kernel then drops, not a goroutine of the test.
func idemBinary(t *testing.T) string { return testenv.IdemBinary(t, "idemfaults") }

// TestCrash kills `idem serve` with SIGKILL at each kill point, restarts
// it without the fault on the same database and port while the client
// keeps retrying with its key, and checks what survived. Each store runs
// on one database for all its iterations, so that a record left in
// flight or an order left over by any iteration is seen by every later
// check.
func TestCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds the idem binary and kills it repeatedly (-short)")
	}
	if *iterations < 1 {
		t.Fatalf("-crashtest.iterations=%d: want at least 1", *iterations)
	}
	bin := idemBinary(t)
	stores := []struct {
		name string
		open func(t *testing.T) *store
	}{
		{"sqlite", openSQLite},
		{"postgres", openPostgres},
	}
	for _, sc := range stores {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			st := sc.open(t)
			st.bin = bin
			st.addr = "127.0.0.1:0" // the first start picks a port; every later one reuses it
			for _, point := range points {
				t.Run(point, func(t *testing.T) {
					var s stats
					for i := range *iterations {
						st.crashOnce(t, point, i, &s)
						if t.Failed() {
							return
						}
					}
					t.Logf("%s %s: %s", sc.name, point, &s)
				})
			}
		})
	}
}

// store is one database under test, read directly (not through the
// demo's API) so that the checks see what is committed, whoever wrote it.
type store struct {
	name  string
	dbArg string // the --db of idem serve
	db    *sql.DB
	ph    func(n int) string // the n-th placeholder of the dialect
	bin   string
	addr  string // host:port of idem serve, kept across restarts
	// orders counts the orders the iterations so far must have left: one
	// per iteration, exactly.
	orders int
	// serveArgs are added to every `idem serve` of the store
	// (--single-transaction).
	serveArgs []string
	// single: the server claims inside the order's transaction, so a kill
	// before the commit leaves nothing at all.
	single bool
	// duplicates: each iteration also sends a duplicate of its request,
	// concurrently, which must get the same order.
	duplicates bool
}

func openSQLite(t *testing.T) *store {
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &store{name: "sqlite", dbArg: "sqlite:" + path, db: db, ph: func(int) string { return "?" }}
}

func openPostgres(t *testing.T) *store {
	url := testenv.PostgresSchema(t)
	db, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return &store{name: "postgres", dbArg: url, db: db, ph: func(n int) string { return fmt.Sprintf("$%d", n) }}
}

// snapshot is what the database holds for one key and its cart.
type snapshot struct {
	state    string // "" when there is no record
	status   int
	orderIDs []string
	inFlight int // records in flight in the whole table
	orders   int // orders in the whole table
}

func (st *store) inspect(t *testing.T, key, cart string) snapshot {
	t.Helper()
	ctx := context.Background()
	var s snapshot
	var status sql.NullInt64
	err := st.db.QueryRowContext(ctx, "SELECT state, status_code FROM idem_keys WHERE tenant_id = "+st.ph(1)+" AND idem_key = "+st.ph(2),
		tenant, key).Scan(&s.state, &status)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		t.Fatalf("read the record: %v", err)
	}
	s.status = int(status.Int64)
	rows, err := st.db.QueryContext(ctx, "SELECT id FROM idem_demo_orders WHERE tenant_id = "+st.ph(1)+" AND cart_id = "+st.ph(2), tenant, cart)
	if err != nil {
		t.Fatalf("read the orders: %v", err)
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		s.orderIDs = append(s.orderIDs, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if err := st.db.QueryRowContext(ctx, "SELECT count(*) FROM idem_keys WHERE state = 'in_flight'").Scan(&s.inFlight); err != nil {
		t.Fatal(err)
	}
	if err := st.db.QueryRowContext(ctx, "SELECT count(*) FROM idem_demo_orders").Scan(&s.orders); err != nil {
		t.Fatal(err)
	}
	return s
}

// result is what the retrying client finally got.
type result struct {
	resp  *http.Response
	body  []byte
	err   error
	trace idemclient.Trace
	took  time.Duration
}

// stats are the counts of one kill point on one store, for the record.
type stats struct {
	runs, attempts, refused, inFlight, replays int
	minAttempts, maxAttempts                   int
	maxTook                                    time.Duration
}

func (s *stats) add(r *result) {
	s.runs++
	n := r.trace.Attempts
	s.attempts += n
	if s.minAttempts == 0 || n < s.minAttempts {
		s.minAttempts = n
	}
	s.maxAttempts = max(s.maxAttempts, n)
	for _, a := range r.trace.History {
		switch {
		case a.Err != nil:
			s.refused++
		case a.Status == http.StatusConflict:
			s.inFlight++
		}
	}
	if r.trace.Replayed {
		s.replays++
	}
	s.maxTook = max(s.maxTook, r.took)
}

func (s *stats) String() string {
	return fmt.Sprintf("%d runs, %d attempts (%d–%d per run): %d without an answer (dead or restarting server), %d × 409 in flight; %d final replays; longest client call %s",
		s.runs, s.attempts, s.minAttempts, s.maxAttempts, s.refused, s.inFlight, s.replays, s.maxTook.Round(time.Millisecond))
}

// crashOnce is one iteration: a server armed to die at point for a fresh
// key, the client's POST under that key, the death, a restart without the
// fault, the client's retries to the end, and the checks.
func (st *store) crashOnce(t *testing.T, point string, i int, s *stats) {
	key := fmt.Sprintf("crash-%s-%s-%d-%s", st.name, point, i, randomHex())
	cart := "cart-" + key

	armed := st.start(t, "IDEM_FAULT="+point, "IDEM_FAULT_KEY="+key)
	st.addr = armed.addr

	done := make(chan *result, 1)
	go func() { done <- post(armed.url(), key, cart) }()
	var dupDone chan *result
	if st.duplicates {
		// A duplicate of the same key, sent while the first is in flight
		// (or once the server died): it waits for the first execution, or
		// finds no server, and retries until the restarted server answers.
		dupDone = make(chan *result, 1)
		go func() {
			time.Sleep(20 * time.Millisecond)
			dupDone <- post(armed.url(), key, cart)
		}()
	}

	// The armed server must die, and by SIGKILL: any other end (a panic,
	// an exit) would not be the crash under test.
	select {
	case <-armed.exited:
	case <-time.After(dieTimeout):
		t.Fatalf("%s: the server armed with IDEM_FAULT=%s did not die within %s:\n%s", key, point, dieTimeout, armed.log())
	}
	if ws, ok := armed.state.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s: the armed server ended with %v, want death by SIGKILL:\n%s", key, armed.state, armed.log())
	}

	// What the crash left, before anything else touches the database:
	// it pins each kill point where faults.go says it is. Errorf, not
	// Fatalf: the restart and the final checks still run, and tell what
	// a broken guarantee costs the client.
	at := st.inspect(t, key, cart)
	committedID := ""
	switch point {
	case "after-claim", "after-write":
		if st.single {
			// The claim, the order and the record are one transaction,
			// which the database rolled back when the process's
			// connection died (SQLite: which never committed): nothing
			// is left, not even a record.
			if at.state != "" || len(at.orderIDs) != 0 {
				t.Errorf("%s: after the kill %s in the single-transaction mode: record %q, orders %v; want neither", key, point, at.state, at.orderIDs)
			}
			break
		}
		// The claim committed on its own; the transaction of the handler
		// (and, after-write, its order) died uncommitted.
		if at.state != "in_flight" || len(at.orderIDs) != 0 {
			t.Errorf("%s: after the kill %s: record %q, orders %v; want in_flight and no order", key, point, at.state, at.orderIDs)
		}
	case "after-commit":
		if at.state != "complete" || at.status != http.StatusCreated || len(at.orderIDs) != 1 {
			t.Errorf("%s: after the kill %s: record %q %d, orders %v; want complete 201 and one order", key, point, at.state, at.status, at.orderIDs)
		} else {
			committedID = at.orderIDs[0]
		}
	}

	restarted := st.start(t)
	var r *result
	select {
	case r = <-done:
	case <-time.After(clientTimeout + 10*time.Second):
		t.Fatalf("%s: the client did not return", key)
	}
	var dup *result
	if dupDone != nil {
		select {
		case dup = <-dupDone:
		case <-time.After(clientTimeout + 10*time.Second):
			t.Fatalf("%s: the duplicate's client did not return", key)
		}
	}
	restarted.stop(t)
	if r.err != nil {
		t.Fatalf("%s: the client's retries ended with %v (attempts %+v):\n%s", key, r.err, r.trace.History, restarted.log())
	}
	s.add(r)

	if r.resp.StatusCode != http.StatusCreated {
		t.Fatalf("%s: final answer %d %s (attempts %+v), want 201", key, r.resp.StatusCode, r.body, r.trace.History)
	}
	// The first attempt must have got no answer: the server died under
	// it. Otherwise the fault fired on some other request.
	if r.trace.Key != key || len(r.trace.History) < 2 || r.trace.History[0].Err == nil {
		t.Fatalf("%s: client trace %+v: want key %s and a first attempt without an answer", key, r.trace, key)
	}
	var created struct {
		ID     string `json:"id"`
		CartID string `json:"cart_id"`
	}
	if err := json.Unmarshal(r.body, &created); err != nil || created.ID == "" || created.CartID != cart {
		t.Fatalf("%s: final body %s: want the order of cart %s", key, r.body, cart)
	}
	if loc := r.resp.Header.Get("Location"); loc != "/orders/"+created.ID {
		t.Fatalf("%s: Location %q, want /orders/%s", key, loc, created.ID)
	}
	if dup != nil {
		// The duplicate gets the one order too, replayed or made by its
		// own attempt (then the first client's was the replay).
		var got struct {
			ID string `json:"id"`
		}
		if dup.err != nil {
			t.Fatalf("%s: the duplicate's retries ended with %v (attempts %+v)", key, dup.err, dup.trace.History)
		}
		if dup.resp.StatusCode != http.StatusCreated || json.Unmarshal(dup.body, &got) != nil || got.ID != created.ID {
			t.Fatalf("%s: the duplicate's answer %d %s, want 201 with order %s", key, dup.resp.StatusCode, dup.body, created.ID)
		}
		s.add(dup)
	}
	replayed := r.resp.Header.Get("Idempotent-Replayed") == "true"
	dupReplayed := dup != nil && dup.resp.Header.Get("Idempotent-Replayed") == "true"
	switch point {
	case "after-commit":
		// The answer was committed but never sent: the retry must get
		// that same answer back, not run the order again.
		if !replayed || !r.trace.Replayed || created.ID != committedID {
			t.Fatalf("%s: final answer replayed=%v for order %s; want the replay of the committed order %q", key, replayed, created.ID, committedID)
		}
		if dup != nil && !dupReplayed {
			t.Fatalf("%s: the duplicate's answer is not a replay; want the replay of the committed order %q", key, committedID)
		}
	default:
		// Nothing had committed but the claim: the retry takes the key
		// over once its lease ends and runs the order, once. With a
		// duplicate, one of the two runs it and the other replays it.
		if dup != nil {
			if replayed == dupReplayed {
				t.Fatalf("%s: replayed=%v and the duplicate's replayed=%v; want one fresh execution and one replay", key, replayed, dupReplayed)
			}
		} else if replayed || r.trace.Replayed {
			t.Fatalf("%s: final answer is a replay; nothing had committed, want a fresh execution", key)
		}
	}

	end := st.inspect(t, key, cart)
	if !slices.Equal(end.orderIDs, []string{created.ID}) {
		t.Fatalf("%s: orders of cart %s: %v, want exactly [%s]", key, cart, end.orderIDs, created.ID)
	}
	if end.state != "complete" || end.status != http.StatusCreated {
		t.Fatalf("%s: record %q %d, want complete 201", key, end.state, end.status)
	}
	if end.inFlight != 0 {
		t.Fatalf("%s: %d records still in flight once every client is done", key, end.inFlight)
	}
	st.orders++
	if end.orders != st.orders {
		t.Fatalf("%s: %d orders in the database after %d iterations: an order without its iteration", key, end.orders, st.orders)
	}
}

// post creates the order of cart through a retrying client that owns key:
// enough attempts, with a short backoff, to outlast a restart and then a
// lease.
func post(url, key, cart string) *result {
	ctx, cancel := context.WithTimeout(context.Background(), clientTimeout)
	defer cancel()
	client := idemclient.NewClient(&idemclient.Transport{
		// A fresh connection per attempt: none outlives the server it
		// was opened to.
		Base:        &http.Transport{DisableKeepAlives: true},
		MaxAttempts: 200,
		BaseDelay:   20 * time.Millisecond,
		MaxDelay:    200 * time.Millisecond,
		KeyFunc:     func() string { return key },
	})
	r := &result{}
	body := fmt.Sprintf(`{"cart_id":%q,"total_cents":1900}`, cart)
	req, err := http.NewRequestWithContext(idemclient.WithTrace(ctx, &r.trace), http.MethodPost, url+"/orders", bytes.NewReader([]byte(body)))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tenant)
	start := time.Now()
	r.resp, r.err = client.Do(req)
	r.took = time.Since(start)
	if r.err == nil {
		r.body, r.err = io.ReadAll(r.resp.Body)
		r.resp.Body.Close()
	}
	return r
}

// proc is a running `idem serve`.
type proc struct {
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	logs   strings.Builder
	ready  chan string // the address of the "listening" line
	exited chan struct{}
	state  *os.ProcessState // once exited is closed
}

var listening = regexp.MustCompile(`msg=listening addr=(\S+)`)

func (p *proc) url() string { return "http://" + p.addr }

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// start runs `idem serve` on st's database and address with faultEnv
// added to an environment from which every IDEM_FAULT variable was
// removed (a restart must run without the fault, whatever the test's own
// environment holds), and waits until it listens.
func (st *store) start(t *testing.T, faultEnv ...string) *proc {
	t.Helper()
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "IDEM_FAULT") })
	env = append(env, faultEnv...)
	// The port was free a moment ago, but the kernel may have lent it to
	// an outgoing connection meanwhile: try again rather than fail.
	for try := 0; ; try++ {
		p := launch(t, st.bin, env, append([]string{"serve", "--addr", st.addr, "--db", st.dbArg, "--lease", lease}, st.serveArgs...)...)
		select {
		case p.addr = <-p.ready:
			return p
		case <-p.exited:
			if try < 20 && strings.Contains(p.log(), "address already in use") {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			t.Fatalf("idem serve exited before listening (%v):\n%s", p.state, p.log())
		case <-time.After(startTimeout):
			t.Fatalf("idem serve did not listen within %s:\n%s", startTimeout, p.log())
		}
	}
}

func launch(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, ready: make(chan string, 1), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.logs.WriteString(line + "\n")
			p.mu.Unlock()
			if m := listening.FindStringSubmatch(line); m != nil {
				p.ready <- m[1]
			}
		}
		cmd.Wait() //nolint:errcheck // the exit is read from ProcessState
		p.state = cmd.ProcessState
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
			t.Logf("idem serve %v (%v):\n%s", args, p.state, p.log())
		}
	})
	return p
}

// stop ends a server cleanly (SIGTERM) and waits for it, so that the next
// iteration can listen on its port.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(startTimeout):
		t.Fatalf("idem serve did not stop after SIGTERM:\n%s", p.log())
	}
	if !p.state.Success() {
		t.Fatalf("idem serve exited with %v after SIGTERM:\n%s", p.state, p.log())
	}
}

func randomHex() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
