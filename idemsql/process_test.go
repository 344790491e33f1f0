package idemsql_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/internal/testenv"
)

// Helper processes: the test binary runs itself as a second (third…)
// process on the same database, to test what threads of one process
// cannot show: a process killed mid-transaction, and claims racing from
// separate processes with separate connection pools.
const (
	helperRole    = "IDEMSQL_HELPER_ROLE"
	helperDialect = "IDEMSQL_HELPER_DIALECT"
	helperDSN     = "IDEMSQL_HELPER_DSN"
	helperTenant  = "IDEMSQL_HELPER_TENANT"
	helperLease   = "IDEMSQL_HELPER_LEASE"
)

// TestHelperProcess is not a test: it is the body of the helper processes,
// and returns at once in a normal run.
func TestHelperProcess(t *testing.T) {
	role := os.Getenv(helperRole)
	if role == "" {
		return
	}
	var dialect idemsql.Dialect
	for _, d := range dialects {
		if d.Name() == os.Getenv(helperDialect) {
			dialect = d
		}
	}
	db, err := openDB(dialect, os.Getenv(helperDSN))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	env := &testDB{dialect: dialect, db: db, store: testenv.Must(idemsql.NewStore(db, dialect))}
	tenant := os.Getenv(helperTenant)
	switch role {
	case "crash":
		helperCrash(env, tenant)
	case "race":
		helperRace(env, tenant)
	case "stepcrash":
		helperStepCrash(env, tenant)
	}
	os.Exit(2)
}

// helperCrash claims, writes a business row in the handler's transaction,
// and dies before committing.
func helperCrash(env *testDB, tenant string) {
	ctx := context.Background()
	p := claimParams(tenant, "order-1", "fp")
	lease, err := time.ParseDuration(os.Getenv(helperLease))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	p.Lease = lease
	if res, err := env.store.Claim(ctx, p); err != nil || !res.Won {
		fmt.Println("error: claim:", res.Won, err)
		os.Exit(2)
	}
	tx, err := env.store.Begin(ctx)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	if err := env.businessWrite(tx.Context(ctx), tenant+"-crash"); err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	fmt.Println("token", p.Token)
	os.Exit(3) // killed between the business write and the commit
}

// helperRace waits for "go" on stdin, then runs goroutines that all do one
// operation at once, and reports how many ran it.
func helperRace(env *testDB, tenant string) {
	engine, err := idem.NewEngine(env.store, &idem.Config{Heartbeat: -1})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	const goroutines = 8
	ctx := context.Background()
	op := idem.Operation{Tenant: tenant, Key: "order-1", Fingerprint: []byte("POST /orders")}
	// Open the connections before the barrier, so that the race is
	// between claims and not between connection set-ups.
	warm := goroutines
	if limit := env.db.Stats().MaxOpenConnections; limit > 0 && limit < warm {
		warm = limit // OpenSQLite's pool: asking for more would wait forever
	}
	env.db.SetMaxIdleConns(warm)
	conns := make([]io.Closer, 0, warm)
	for range warm {
		c, err := env.db.Conn(ctx)
		if err == nil {
			conns = append(conns, c)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	fmt.Println("ready")
	if line, _ := bufio.NewReader(os.Stdin).ReadString('\n'); line != "go\n" {
		os.Exit(2)
	}
	var runs, fresh, replayed, inFlight atomic.Int32
	var failures []string
	var mu sync.Mutex
	atOnce(goroutines, func(int) {
		out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			runs.Add(1)
			return idem.Result{Status: 201}, env.businessWrite(ctx, tenant+"-race")
		})
		switch {
		case errors.Is(err, idem.ErrInFlight):
			inFlight.Add(1)
		case err != nil:
			mu.Lock()
			failures = append(failures, err.Error())
			mu.Unlock()
		case out.Replayed:
			replayed.Add(1)
		default:
			fresh.Add(1)
		}
	})
	for _, f := range failures {
		fmt.Println("error:", f)
	}
	fmt.Printf("runs %d fresh %d replayed %d inflight %d\n", runs.Load(), fresh.Load(), replayed.Load(), inFlight.Load())
	os.Exit(0)
}

func helperCommand(t *testing.T, env *testDB, role, tenant string, lease time.Duration) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A helper that hangs is killed, so that the test fails instead of
	// waiting for the binary's timeout.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, exe, "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(),
		helperRole+"="+role,
		helperDialect+"="+env.dialect.Name(),
		helperDSN+"="+env.dsn,
		helperTenant+"="+tenant,
		helperLease+"="+lease.String())
	cmd.Stderr = os.Stderr
	return cmd
}

// TestProcessKilledMidTransaction kills a process between its business
// write and its commit: the write must vanish, the key stay in flight until
// the lease ends, and then be taken over by another process.
func TestProcessKilledMidTransaction(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		var tenant string
		var died time.Time
		for lease := shortLease; ; lease *= 2 {
			tenant = newName("tenant")
			out, err := helperCommand(t, env, "crash", tenant, lease).Output()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 3 {
				t.Fatalf("helper: %v, output %q", err, out)
			}
			died = time.Now()
			tokenText, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "token ")
			token, perr := strconv.ParseInt(tokenText, 10, 64)
			if !ok || perr != nil {
				t.Fatalf("helper output %q", out)
			}
			mustCount(t, env, tenant+"-crash", 0)
			rec := mustGet(t, env.store, tenant, "order-1")
			if rec.State != idem.StateInFlight || rec.LeaseToken != token {
				t.Fatalf("record after the crash: %+v, want in flight under %d", rec, token)
			}
			if lostInLease(t, env.store, claimParams(tenant, "order-1", "fp"), rec.LockedUntil) {
				sleepPast(died, lease)
				break
			}
		}

		taker := claimParams(tenant, "order-1", "fp")
		mustClaim(t, env.store, taker, true)
		mustComplete(t, env.store, tenant, "order-1", taker.Token, idem.Result{Status: 201})
		mustCount(t, env, tenant+"-crash", 0)
	})
}

// TestProcessesRace runs one operation at the same instant from several
// processes with several goroutines each: it runs once, and writes once.
func TestProcessesRace(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		const processes = 3
		tenant := newName("tenant")
		type helper struct {
			cmd   *exec.Cmd
			stdin io.WriteCloser
			out   *bufio.Reader
		}
		helpers := make([]helper, processes)
		for i := range helpers {
			cmd := helperCommand(t, env, "race", tenant, 0)
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			helpers[i] = helper{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		}
		for i, h := range helpers {
			if line, err := h.out.ReadString('\n'); line != "ready\n" {
				t.Fatalf("helper %d: %q, %v", i, line, err)
			}
		}
		for _, h := range helpers { // the barrier across processes
			_, _ = io.WriteString(h.stdin, "go\n")
		}
		var runs, fresh int
		for i, h := range helpers {
			rest, _ := io.ReadAll(h.out)
			if err := h.cmd.Wait(); err != nil {
				t.Fatalf("helper %d: %v\n%s", i, err, rest)
			}
			lines := strings.Split(strings.TrimSpace(string(rest)), "\n")
			for _, l := range lines[:len(lines)-1] {
				t.Errorf("helper %d: %s", i, l)
			}
			var r, f, rp, fl int
			if _, err := fmt.Sscanf(lines[len(lines)-1], "runs %d fresh %d replayed %d inflight %d", &r, &f, &rp, &fl); err != nil {
				t.Fatalf("helper %d: %q: %v", i, rest, err)
			}
			runs += r
			fresh += f
		}
		if runs != 1 || fresh != 1 {
			t.Fatalf("%d processes at once: the operation ran %d times, %d fresh outcomes; want 1", processes, runs, fresh)
		}
		mustCount(t, env, tenant+"-race", 1)
	})
}
