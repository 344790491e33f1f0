package crashtest

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
)

// The tests in this file kill a process in the middle of a payment that
// records its steps (idem.Step) on PostgreSQL (idempg), with SIGKILL, and
// retry the payment, with the same key, in new processes until it
// completes. The payment calls a card network twice (a charge, then a
// receipt) and writes a payment row in idem's transaction. The card
// network is two tables written outside idem, each call in a transaction
// of its own, as a remote service would commit it: card_calls logs every
// call, so that it counts how many times each step's function ran;
// card_effects holds one row per downstream key (idem.DownstreamKey), the
// network's own idempotency, so that it counts the effects.

var stepKeys = flag.Int("crashtest.stepkeys", 20, "keys per kill point in the recovery-point tests")

// stepKillPoints are where the payment process is killed: once each
// step is recorded, and after the business write, before the completion.
var stepKillPoints = []string{"after-charge", "after-receipt", "before-complete"}

// Environment of the payment process (TestStepsPaymentProcess).
const (
	envStepsURL  = "IDEM_STEPS_URL"
	envStepsKey  = "IDEM_STEPS_KEY"
	envStepsKill = "IDEM_STEPS_KILL"
)

const (
	// stepsLease is the payment processes' lease: short, so that a retry
	// takes over the key of a killed process soon.
	stepsLease = 400 * time.Millisecond
	// exitInFlight is the payment process's exit status when the key is
	// still held (the killed process's lease has not ended yet).
	exitInFlight = 4
	// keyTimeout bounds the retries of one key before the test says so.
	keyTimeout = 2 * time.Minute
)

const cardNetworkSchema = `
CREATE TABLE card_calls (
	idem_key       text NOT NULL,
	step           text NOT NULL,
	downstream_key text NOT NULL,
	at             timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE card_effects (
	downstream_key text PRIMARY KEY,
	idem_key       text NOT NULL,
	step           text NOT NULL,
	ref            text NOT NULL
);
CREATE TABLE payments (
	idem_key text NOT NULL,
	charge   text NOT NULL,
	receipt  text NOT NULL
)`

// TestStepsSurviveKill kills the payment process at each kill point, once
// or several times per key (a retry that takes the key over may be killed
// too), 3 × -crashtest.stepkeys keys in all, and retries each key in new
// processes until it completes. Each step's function must have run once
// per key, the payment row be written once, and the stored answer name
// the one charge and the one receipt.
func TestStepsSurviveKill(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts and kills hundreds of processes (-short)")
	}
	if *stepKeys < 1 {
		t.Fatalf("-crashtest.stepkeys=%d: want at least 1", *stepKeys)
	}
	url, pool := stepsDatabase(t)
	var keys []stepsKey
	for i := range *stepKeys * len(stepKillPoints) {
		kills := []string{stepKillPoints[i%len(stepKillPoints)]}
		for range mrand.IntN(3) {
			kills = append(kills, stepKillPoints[mrand.IntN(len(stepKillPoints))])
		}
		keys = append(keys, stepsKey{key: fmt.Sprintf("pay-%d-%s", i, randomHex()), kills: kills})
	}
	runStepKeys(t, url, keys)

	for _, k := range keys {
		got := readPayment(t, pool, k.key)
		if got.calls["charge"] != 1 || got.calls["receipt"] != 1 {
			t.Errorf("%s (killed %v): the card network was called %v times, want each step once", k.key, k.kills, got.calls)
		}
		got.check(t, k)
	}
	checkNothingInFlight(t, pool)
}

// TestStepsKilledInsideStep kills the payment process in the one window
// recovery points leave open: inside the charge's function, once the card
// network has committed the charge, before idem records the step. The
// retry cannot know the charge happened, and calls the card network
// again; it calls it with the same downstream key, so the network answers
// with the charge it made the first time: two calls, one charge.
func TestStepsKilledInsideStep(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts and kills processes (-short)")
	}
	url, pool := stepsDatabase(t)
	var keys []stepsKey
	for i := range max(*stepKeys/2, 1) {
		keys = append(keys, stepsKey{key: fmt.Sprintf("window-%d-%s", i, randomHex()), kills: []string{"inside-charge"}})
	}
	runStepKeys(t, url, keys)

	for _, k := range keys {
		got := readPayment(t, pool, k.key)
		if got.calls["charge"] != 2 || got.calls["receipt"] != 1 {
			t.Errorf("%s: the card network was called %v times, want the charge twice (the window) and the receipt once", k.key, got.calls)
		}
		got.check(t, k)
	}
	checkNothingInFlight(t, pool)
}

// stepsDatabase is a fresh schema with idem's tables, the card network's
// and the payments table.
func stepsDatabase(t *testing.T) (string, *pgxpool.Pool) {
	url := testenv.PostgresSchema(t)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	if err := idempg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, cardNetworkSchema); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

// stepsKey is one payment and the points where its processes are killed,
// in order; the process after the last kill runs to the end.
type stepsKey struct {
	key   string
	kills []string
}

// runStepKeys runs every key's processes, a few keys at a time: each
// process waits on a kill point or a lease most of its life.
func runStepKeys(t *testing.T, url string, keys []stepsKey) {
	work := make(chan stepsKey)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total stepsStats
	for range 6 {
		wg.Go(func() {
			for k := range work {
				var s stepsStats
				err := runStepKey(url, k, &s)
				if err != nil {
					t.Errorf("%s (kills %v): %v", k.key, k.kills, err)
				}
				mu.Lock()
				total.processes += s.processes
				total.inFlight += s.inFlight
				for point, n := range s.killed {
					total.kill(point, n)
				}
				mu.Unlock()
			}
		})
	}
	for _, k := range keys {
		work <- k
	}
	close(work)
	wg.Wait()
	t.Logf("%d keys: %d payment processes; killed at their kill point: %v; %d found the key still held", len(keys), total.processes, total.killed, total.inFlight)
	if t.Failed() {
		t.FailNow()
	}
}

// stepsStats count the processes of the payments, for the log.
type stepsStats struct {
	processes, inFlight int
	killed              map[string]int // per kill point
}

func (s *stepsStats) kill(point string, n int) {
	if s.killed == nil {
		s.killed = map[string]int{}
	}
	s.killed[point] += n
}

// runStepKey starts a payment process for each kill in turn, kills it
// with SIGKILL once it reports that it reached its kill point, and then
// starts processes without a kill until one completes the payment. A
// process that finds the key still held by a killed one (its lease not
// ended yet) exits; the next one is started a moment later.
func runStepKey(url string, k stepsKey, s *stepsStats) error {
	deadline := time.Now().Add(keyTimeout)
	for _, kill := range k.kills {
		for {
			s.processes++
			status, out, err := runPaymentProcess(url, k.key, kill)
			if err != nil {
				return err
			}
			if status == exitInFlight && time.Now().Before(deadline) {
				s.inFlight++
				time.Sleep(stepsLease / 4)
				continue
			}
			if status != int(syscall.SIGKILL)+128 || !strings.Contains(out, "\nat "+kill+"\n") {
				return fmt.Errorf("the process armed to die %s ended with status %d:\n%s", kill, status, out)
			}
			s.kill(kill, 1)
			break
		}
	}
	for time.Now().Before(deadline) {
		s.processes++
		status, out, err := runPaymentProcess(url, k.key, "")
		switch {
		case err != nil:
			return err
		case status == exitInFlight:
			s.inFlight++
			time.Sleep(stepsLease / 4)
		case status != 0 || !completedLine.MatchString(out):
			return fmt.Errorf("the last process ended with status %d:\n%s", status, out)
		default:
			return nil
		}
	}
	return fmt.Errorf("still in flight after %s", keyTimeout)
}

var completedLine = regexp.MustCompile(`(?m)^completed `)

// runPaymentProcess runs one payment process for key, armed to stop at
// kill ("" for none), where the parent kills it: it returns the exit
// status (128+9 for SIGKILL) and the process's output.
func runPaymentProcess(url, key, kill string) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), keyTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStepsPaymentProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envStepsURL+"="+url, envStepsKey+"="+key, envStepsKill+"="+kill)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, "", err
	}
	if err := cmd.Start(); err != nil {
		return 0, "", err
	}
	var out strings.Builder
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		line := lines.Text()
		out.WriteString(line + "\n")
		if kill != "" && line == "at "+kill {
			// The process waits there: kill it where it stands.
			_ = cmd.Process.Signal(syscall.SIGKILL)
		}
	}
	err = cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return 0, "", err
	}
	status := cmd.ProcessState.ExitCode()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		status = 128 + int(ws.Signal())
	}
	return status, out.String() + stderr.String(), nil
}

// TestStepsPaymentProcess is the payment process of the tests above,
// which start it with the environment naming the database, the key, and
// where to stop. It runs the payment through idem.Engine, and prints
// "completed <answer>" once it completed, or exits with exitInFlight when
// the key is still held.
func TestStepsPaymentProcess(t *testing.T) {
	url, key, kill := os.Getenv(envStepsURL), os.Getenv(envStepsKey), os.Getenv(envStepsKill)
	if url == "" {
		t.Skip("started by TestStepsSurviveKill and TestStepsKilledInsideStep only")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := idempg.NewStore(pool, nil)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := idem.NewEngine(store, &idem.Config{Lease: stepsLease})
	if err != nil {
		t.Fatal(err)
	}
	// stop reports that the process reached point and waits there for
	// the SIGKILL, if point is where it was armed to stop.
	stop := func(point string) {
		if point != kill {
			return
		}
		fmt.Printf("at %s\n", point)
		time.Sleep(time.Minute)
		fmt.Println("not killed")
		os.Exit(5)
	}
	out, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: key, Fingerprint: []byte("pay 1900")},
		func(ctx context.Context) (idem.Result, error) {
			charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
				return cardNetwork(ctx, pool, key, "charge", stop)
			})
			if err != nil {
				return idem.Result{}, err
			}
			stop("after-charge")
			receipt, err := idem.Step(ctx, "receipt", func(ctx context.Context) (string, error) {
				return cardNetwork(ctx, pool, key, "receipt", stop)
			})
			if err != nil {
				return idem.Result{}, err
			}
			stop("after-receipt")
			if _, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO payments (idem_key, charge, receipt) VALUES ($1, $2, $3)`,
				key, charge, receipt); err != nil {
				return idem.Result{}, err
			}
			stop("before-complete")
			return idem.Result{Status: 201, Body: []byte(charge + " " + receipt)}, nil
		})
	switch {
	case errors.Is(err, idem.ErrInFlight):
		_ = engine.Close(ctx)
		os.Exit(exitInFlight)
	case err != nil:
		t.Fatal(err)
	}
	fmt.Printf("completed %s\n", out.Result.Body)
}

// cardNetwork is one call to the card network, committed on its own, as
// the network would: it logs the call, and makes the effect unless one
// was made for the same downstream key, whose reference it then returns.
func cardNetwork(ctx context.Context, pool *pgxpool.Pool, key, step string, stop func(string)) (string, error) {
	dk := idem.DownstreamKey(ctx, step)
	if _, err := pool.Exec(ctx, `INSERT INTO card_calls (idem_key, step, downstream_key) VALUES ($1, $2, $3)`, key, step, dk); err != nil {
		return "", err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO card_effects (downstream_key, idem_key, step, ref) VALUES ($1, $2, $3, $4)
		ON CONFLICT (downstream_key) DO NOTHING`, dk, key, step, step+"_"+randomHex()); err != nil {
		return "", err
	}
	var ref string
	if err := pool.QueryRow(ctx, `SELECT ref FROM card_effects WHERE downstream_key = $1`, dk).Scan(&ref); err != nil {
		return "", err
	}
	stop("inside-" + step)
	return ref, nil
}

// payment is what the database holds for one key.
type payment struct {
	key         string
	calls       map[string]int // card network calls per step
	downstream  map[string]int // distinct downstream keys per step
	effects     map[string][]string
	payments    []string // charge and receipt of each payments row
	state, body string
}

func readPayment(t *testing.T, pool *pgxpool.Pool, key string) payment {
	t.Helper()
	ctx := context.Background()
	p := payment{key: key, calls: map[string]int{}, downstream: map[string]int{}, effects: map[string][]string{}}
	rows, err := pool.Query(ctx, `SELECT step, count(*), count(DISTINCT downstream_key) FROM card_calls WHERE idem_key = $1 GROUP BY step`, key)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var step string
		var calls, distinct int
		if err := rows.Scan(&step, &calls, &distinct); err != nil {
			t.Fatal(err)
		}
		p.calls[step], p.downstream[step] = calls, distinct
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT step, ref FROM card_effects WHERE idem_key = $1`, key)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var step, ref string
		if err := rows.Scan(&step, &ref); err != nil {
			t.Fatal(err)
		}
		p.effects[step] = append(p.effects[step], ref)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows, err = pool.Query(ctx, `SELECT charge || ' ' || receipt FROM payments WHERE idem_key = $1`, key)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		p.payments = append(p.payments, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var body []byte
	if err := pool.QueryRow(ctx, `SELECT state, response_body FROM idem_keys WHERE tenant_id = $1 AND idem_key = $2`, tenant, key).Scan(&p.state, &body); err != nil {
		t.Fatalf("%s: read the record: %v", key, err)
	}
	p.body = string(body)
	return p
}

// check verifies what holds whatever the kills: one downstream key and
// one effect per step, one payment row, and a completed record whose
// answer names the effects that were made.
func (p payment) check(t *testing.T, k stepsKey) {
	t.Helper()
	for _, step := range []string{"charge", "receipt"} {
		if p.downstream[step] != 1 || len(p.effects[step]) != 1 {
			t.Errorf("%s (killed %v): step %s: %d downstream keys, effects %v; want one of each", p.key, k.kills, step, p.downstream[step], p.effects[step])
			return
		}
	}
	want := p.effects["charge"][0] + " " + p.effects["receipt"][0]
	if p.state != "complete" || p.body != want || len(p.payments) != 1 || p.payments[0] != want {
		t.Errorf("%s (killed %v): record %s answering %q, payments %q; want complete, answering and paid once with %q",
			p.key, k.kills, p.state, p.body, p.payments, want)
	}
}

func checkNothingInFlight(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idem_keys WHERE state = 'in_flight'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("%d records still in flight once every payment completed", n)
	}
}
