package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/internal/testenv"
)

// charge is what the tests' steps return: a card charge made outside the
// store's transaction.
type charge struct{ ID string }

// stepNames lists the names of steps, in order.
func stepNames(steps []idem.RecordedStep) []string {
	var out []string
	for _, s := range steps {
		out = append(out, s.Name)
	}
	return out
}

func saveStep(ctx context.Context, st *idemsql.Store, p idem.ClaimParams, name, value string) error {
	return st.SaveStep(ctx, idem.SaveStepParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Name: name, Value: []byte(value)})
}

// TestSaveStepFenced: a step is saved only under the token that holds the
// record in flight, and reads back in order through Get.
func TestSaveStepFenced(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		p := claimParams(tenant, "order-1", "fp")
		mustClaim(t, env.store, p, true)
		for _, name := range []string{"charge", "email"} {
			if err := saveStep(ctx, env.store, p, name, `"`+name+`-value"`); err != nil {
				t.Fatalf("SaveStep(%s) under the holding token: %v", name, err)
			}
		}
		other := p
		other.Token = nextToken()
		if err := saveStep(ctx, env.store, other, "ship", `1`); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("SaveStep under another token = %v, want idem.ErrLeaseLost", err)
		}
		absent := claimParams(tenant, "no-such-key", "fp")
		if err := saveStep(ctx, env.store, absent, "ship", `1`); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("SaveStep of a key without a record = %v, want idem.ErrLeaseLost", err)
		}
		rec := mustGet(t, env.store, tenant, "order-1")
		if got := stepNames(rec.Steps); !slices.Equal(got, []string{"charge", "email"}) {
			t.Fatalf("steps %q, want charge then email", got)
		}
		if string(rec.Steps[0].Value) != `"charge-value"` {
			t.Fatalf("charge recorded %q", rec.Steps[0].Value)
		}
		mustComplete(t, env.store, tenant, "order-1", p.Token, idem.Result{Status: 201})
		if err := saveStep(ctx, env.store, p, "late", `1`); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("SaveStep after the completion = %v, want idem.ErrLeaseLost", err)
		}
		if got := stepNames(mustGet(t, env.store, tenant, "order-1").Steps); !slices.Equal(got, []string{"charge", "email"}) {
			t.Fatalf("steps of the complete record %q", got)
		}
	})
}

// TestSaveStepFencedFoundRows: on MySQL the fence reads rows affected,
// which count found or changed rows depending on the driver's
// clientFoundRows: both answer the same.
func TestSaveStepFencedFoundRows(t *testing.T) {
	t.Parallel()
	base := newTestDB(t, idemmysql.Dialect)
	for _, found := range []bool{false, true} {
		cfg, err := mysql.ParseDSN(base.dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ClientFoundRows = found
		db := sqlOpen(t, "mysql", cfg.FormatDSN())
		defer db.Close()
		st := testenv.Must(idemsql.NewStore(db, idemmysql.Dialect))
		ctx := context.Background()
		p := claimParams(newName("tenant"), "order-1", "fp")
		mustClaim(t, st, p, true)
		// The same step twice: the second append changes the row too.
		for range 2 {
			if err := saveStep(ctx, st, p, "charge", `1`); err != nil {
				t.Fatalf("clientFoundRows=%v: SaveStep: %v", found, err)
			}
		}
		other := p
		other.Token = nextToken()
		if err := saveStep(ctx, st, other, "charge", `1`); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("clientFoundRows=%v: SaveStep under another token = %v, want idem.ErrLeaseLost", found, err)
		}
	}
}

// TestReleaseKeepsSteps: a released record that holds steps stays in
// flight with its lease ended, and the next claim with its fingerprint
// takes it over at once and gets them; one with another fingerprint does
// not. A record past its retention loses its steps to the claim that
// replaces it.
func TestReleaseKeepsSteps(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		p := claimParams(tenant, "order-1", "fp")
		mustClaim(t, env.store, p, true)
		if err := saveStep(ctx, env.store, p, "charge", `{"ID":"ch_1"}`); err != nil {
			t.Fatal(err)
		}
		if err := env.store.Release(ctx, idem.ReleaseParams{Tenant: tenant, Key: "order-1", Token: p.Token}); err != nil {
			t.Fatal(err)
		}
		rec := mustGet(t, env.store, tenant, "order-1")
		if rec.State != idem.StateInFlight || rec.LeaseToken != p.Token || len(rec.Steps) != 1 {
			t.Fatalf("record after Release: %+v, want in flight under the released token with its step", rec)
		}
		mustClaim(t, env.store, claimParams(tenant, "order-1", "other fp"), false)

		retry := claimParams(tenant, "order-1", "fp")
		res, err := env.peer.Claim(ctx, retry)
		if err != nil || !res.Won || !res.Takeover {
			t.Fatalf("retry after Release = %+v, %v; want a takeover", res, err)
		}
		if got := stepNames(res.Steps); !slices.Equal(got, []string{"charge"}) || string(res.Steps[0].Value) != `{"ID":"ch_1"}` {
			t.Fatalf("takeover steps %+v", res.Steps)
		}

		// A fresh key is no takeover; a record past its retention is
		// replaced without its steps.
		q := claimParams(tenant, "order-2", "fp")
		q.Lease, q.Retention = shortLease, shortLease
		res, err = env.store.Claim(ctx, q)
		if err != nil || !res.Won || res.Takeover || res.Steps != nil {
			t.Fatalf("claim of a fresh key = %+v, %v", res, err)
		}
		claimed := time.Now()
		if err := saveStep(ctx, env.store, q, "charge", `1`); err != nil {
			t.Fatal(err)
		}
		sleepPast(claimed, q.Retention)
		res, err = env.store.Claim(ctx, claimParams(tenant, "order-2", "another request"))
		if err != nil || !res.Won || res.Takeover || res.Steps != nil {
			t.Fatalf("claim over a record past retention = %+v, %v; want a fresh claim without steps", res, err)
		}
		if steps := mustGet(t, env.store, tenant, "order-2").Steps; steps != nil {
			t.Fatalf("record replaced past retention kept steps %+v", steps)
		}
	})
}

// stepCounter is a step function that counts its runs.
type stepCounter struct{ runs atomic.Int32 }

func (c *stepCounter) charge(context.Context) (charge, error) {
	c.runs.Add(1)
	return charge{ID: "ch_1"}, nil
}

// TestStepSurvivesRollback: a handler writes, records a step, then fails.
// Its write is rolled back and the key released, but the step stays
// recorded: the retry takes the key over, gets the step's result without
// running it, and completes. On SQLite the handler's transaction holds the
// write lock when the step is saved: the step must neither wait for that
// lock (a deadlock) nor go down with the rollback. The step may come
// before the handler's first statement too.
func TestStepSurvivesRollback(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		for _, stepFirst := range []bool{false, true} {
			t.Run(fmt.Sprintf("stepFirst=%v", stepFirst), func(t *testing.T) {
				testStepSurvivesRollback(t, env, stepFirst)
			})
		}
	})
}

func testStepSurvivesRollback(t *testing.T, env *testDB, stepFirst bool) {
	// Bounded: a step that waits for its own transaction's lock would hang.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine := newEngine(t, env.store, nil)
	op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1", Fingerprint: []byte("POST /pay")}
	business := newName("order")
	var steps stepCounter
	failure := errors.New("the handler failed after the charge")
	_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if x, _ := idem.ExecutionFromContext(ctx); x.Takeover {
			t.Error("the first execution is reported as a takeover")
		}
		if !stepFirst {
			if err := env.businessWrite(ctx, business); err != nil {
				return idem.Result{}, err
			}
		}
		if _, err := idem.Step(ctx, "charge", steps.charge); err != nil {
			return idem.Result{}, fmt.Errorf("step: %w", err)
		}
		if got := stepNames(mustGet(t, env.store, op.Tenant, op.Key).Steps); !slices.Equal(got, []string{"charge"}) {
			t.Errorf("Get while the handler runs: steps %q, want the charge", got)
		}
		if stepFirst {
			if err := env.businessWrite(ctx, business); err != nil {
				return idem.Result{}, err
			}
		}
		return idem.Result{}, failure
	})
	if !errors.Is(err, failure) {
		t.Fatalf("first Do = %v, want the handler's error", err)
	}
	mustCount(t, env, business, 0)
	rec := mustGet(t, env.store, op.Tenant, op.Key)
	if rec.State != idem.StateInFlight || !slices.Equal(stepNames(rec.Steps), []string{"charge"}) {
		t.Fatalf("record after the failure: %+v, want in flight with the charge", rec)
	}

	out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		x, _ := idem.ExecutionFromContext(ctx)
		if !x.Takeover || x.RecoveryPoint != "charge" {
			t.Errorf("retry: execution %+v, want a takeover from the charge", x)
		}
		c, err := idem.Step(ctx, "charge", steps.charge)
		if err != nil || c.ID != "ch_1" {
			return idem.Result{}, fmt.Errorf("step on the retry: %+v, %w", c, err)
		}
		return idem.Result{Status: 201}, env.businessWrite(ctx, business)
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("retry = %+v, %v", out, err)
	}
	if n := steps.runs.Load(); n != 1 {
		t.Fatalf("the charge ran %d times, want once", n)
	}
	mustCount(t, env, business, 1)
	if rec := mustGet(t, env.store, op.Tenant, op.Key); rec.State != idem.StateComplete || len(rec.Steps) != 1 {
		t.Fatalf("record after the retry: %+v", rec)
	}
}

// TestStepsCommitWithTheHandler: steps recorded by a handler that
// succeeds are kept by the complete record, on SQLite too, where they went
// to the step journal meanwhile and the journal is left empty.
func TestStepsCommitWithTheHandler(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1"}
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if _, err := idem.Step(ctx, "reserve", func(context.Context) (int, error) { return 7, nil }); err != nil {
				return idem.Result{}, err
			}
			if err := env.businessWrite(ctx, newName("order")); err != nil {
				return idem.Result{}, err
			}
			if _, err := idem.Step(ctx, "charge", (&stepCounter{}).charge); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rec := mustGet(t, env.store, op.Tenant, op.Key)
		if rec.State != idem.StateComplete || !slices.Equal(stepNames(rec.Steps), []string{"reserve", "charge"}) {
			t.Fatalf("record %+v, want complete with reserve then charge", rec)
		}
		if env.dialect == idemsql.SQLite {
			if n := journalRows(t, env, ""); n != 0 {
				t.Fatalf("the journal holds %d rows after the completion, want 0", n)
			}
		}
	})
}

// journalRows counts the rows of the SQLite step journal beside env's
// database, those of tenant when it is not "".
func journalRows(t *testing.T, env *testDB, tenant string) int {
	t.Helper()
	if _, err := os.Stat(env.dsn + "-idem-steps"); errors.Is(err, os.ErrNotExist) {
		return 0
	}
	db := sqlOpen(t, "sqlite", env.dsn+"-idem-steps")
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM idem_steps WHERE ? = '' OR tenant_id = ?`, tenant, tenant).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStepTakeoverAfterCrash: a process records a step and dies before its
// transaction ends (on SQLite, with the step in the journal and the write
// lock held). Once the lease has ended, another process takes the key over
// with the step, and the step does not run again.
func TestStepTakeoverAfterCrash(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		lease := time.Second
		out, err := helperCommand(t, env, "stepcrash", tenant, lease).Output()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 || strings.TrimSpace(string(out)) != "saved" {
			t.Fatalf("helper: %v, output %q", err, out)
		}
		died := time.Now()
		mustCount(t, env, tenant+"-crash", 0)
		rec := mustGet(t, env.store, tenant, "order-1")
		if rec.State != idem.StateInFlight || !slices.Equal(stepNames(rec.Steps), []string{"charge"}) {
			t.Fatalf("record after the crash: %+v, want in flight with the charge", rec)
		}
		sleepPast(died, lease)
		engine := newEngine(t, env.store, nil)
		var steps stepCounter
		_, err = engine.Do(ctx, idem.Operation{Tenant: tenant, Key: "order-1", Fingerprint: []byte("fp")}, func(ctx context.Context) (idem.Result, error) {
			if x, _ := idem.ExecutionFromContext(ctx); !x.Takeover || x.RecoveryPoint != "charge" {
				t.Errorf("execution %+v, want a takeover from the charge", x)
			}
			c, err := idem.Step(ctx, "charge", steps.charge)
			if err != nil || c.ID != "ch_crashed" {
				return idem.Result{}, fmt.Errorf("step: %+v, %w", c, err)
			}
			return idem.Result{Status: 201}, env.businessWrite(ctx, tenant+"-crash")
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := steps.runs.Load(); n != 0 {
			t.Fatalf("the charge ran again %d times after the takeover", n)
		}
		mustCount(t, env, tenant+"-crash", 1)
		if env.dialect == idemsql.SQLite {
			if n := journalRows(t, env, tenant); n != 0 {
				t.Fatalf("the journal holds %d rows of the key after the takeover, want 0", n)
			}
		}
	})
}

// helperStepCrash runs an execution that writes, records a step, and dies
// before its transaction ends.
func helperStepCrash(env *testDB, tenant string) {
	lease, err := time.ParseDuration(os.Getenv(helperLease))
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	engine, err := idem.NewEngine(env.store, &idem.Config{Lease: lease, Heartbeat: -1})
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	_, err = engine.Do(context.Background(), idem.Operation{Tenant: tenant, Key: "order-1", Fingerprint: []byte("fp")},
		func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, tenant+"-crash"); err != nil {
				return idem.Result{}, err
			}
			if _, err := idem.Step(ctx, "charge", func(context.Context) (charge, error) { return charge{ID: "ch_crashed"}, nil }); err != nil {
				return idem.Result{}, err
			}
			fmt.Println("saved")
			os.Exit(3) // killed after the step, inside the handler's transaction
			return idem.Result{}, nil
		})
	fmt.Println("error:", err)
	os.Exit(2)
}

// TestConcurrentTakeoverWithSteps: duplicates arriving at one instant on a
// released key that holds steps: exactly one takes it over, gets the steps
// and runs; the others get the key in flight or its replay; the step never
// runs again.
func TestConcurrentTakeoverWithSteps(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		engines := []*idem.Engine{newEngine(t, env.store, nil), newEngine(t, env.peer, nil)}
		op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1", Fingerprint: []byte("POST /pay")}
		var steps stepCounter
		failure := errors.New("failed after the charge")
		_, err := engines[0].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if _, err := idem.Step(ctx, "charge", steps.charge); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{}, failure
		})
		if !errors.Is(err, failure) {
			t.Fatal(err)
		}
		const n = 12
		var runs, takeovers, inFlight, replays atomic.Int32
		var mu sync.Mutex
		var failures []error
		atOnce(n, func(i int) {
			out, err := engines[i%2].Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				runs.Add(1)
				if x, _ := idem.ExecutionFromContext(ctx); x.Takeover && x.RecoveryPoint == "charge" {
					takeovers.Add(1)
				}
				if _, err := idem.Step(ctx, "charge", steps.charge); err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: 201}, env.businessWrite(ctx, op.Key+op.Tenant)
			})
			switch {
			case errors.Is(err, idem.ErrInFlight):
				inFlight.Add(1)
			case err == nil && out.Replayed:
				replays.Add(1)
			case err != nil:
				mu.Lock()
				failures = append(failures, err)
				mu.Unlock()
			}
		})
		if len(failures) > 0 {
			t.Fatalf("failures: %v", failures)
		}
		if runs.Load() != 1 || takeovers.Load() != 1 || steps.runs.Load() != 1 {
			t.Fatalf("%d runs, %d takeovers with the charge, the charge ran %d times; want one takeover and the charge once (in flight %d, replays %d)",
				runs.Load(), takeovers.Load(), steps.runs.Load(), inFlight.Load(), replays.Load())
		}
		mustCount(t, env, op.Key+op.Tenant, 1)
	})
}

// TestJournalSweep: Purge deletes the journal rows of tokens that hold no
// record (left by a crash or a failed delete), and keeps the others.
func TestJournalSweep(t *testing.T) {
	t.Parallel()
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	tenant := newName("tenant")
	p := claimParams(tenant, "order-1", "fp")
	mustClaim(t, env.store, p, true)
	// A step saved under the lock of the execution's own transaction
	// creates the journal.
	engine := newEngine(t, env.store, nil)
	op := idem.Operation{Tenant: tenant, Key: "order-2"}
	if _, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := env.businessWrite(ctx, "x"); err != nil {
			return idem.Result{}, err
		}
		_, err := idem.Step(ctx, "charge", (&stepCounter{}).charge)
		return idem.Result{Status: 200}, err
	}); err != nil {
		t.Fatal(err)
	}
	journal := sqlOpen(t, "sqlite", env.dsn+"-idem-steps")
	defer journal.Close()
	step := idem.AppendStep(nil, "charge", []byte(`1`))
	for _, token := range []int64{p.Token, nextToken()} {
		if _, err := journal.ExecContext(ctx, `INSERT INTO idem_steps (tenant_id, idem_key, lease_token, step) VALUES (?, ?, ?, ?)`,
			tenant, "order-1", token, step); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.store.Purge(ctx, idem.PurgeParams{}); err != nil {
		t.Fatal(err)
	}
	var tokens []int64
	rows, err := journal.QueryContext(ctx, `SELECT lease_token FROM idem_steps`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var tok int64
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, tok)
	}
	rows.Close()
	if !slices.Equal(tokens, []int64{p.Token}) {
		t.Fatalf("journal tokens after Purge %v, want only the holder's %d", tokens, p.Token)
	}
	// The holder's rows are its steps.
	if got := stepNames(mustGet(t, env.store, tenant, "order-1").Steps); !slices.Equal(got, []string{"charge"}) {
		t.Fatalf("steps %q", got)
	}
}

// TestStepsMigrateForward: a database whose tables predate the steps
// column (migrations before 0003) migrates forward with its records, which
// then replay, and take steps.
func TestStepsMigrateForward(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		tenant := newName("tenant")
		done := claimParams(tenant, "done", "fp")
		mustClaim(t, env.store, done, true)
		mustComplete(t, env.store, tenant, "done", done.Token, idem.Result{Status: 201, Body: []byte("ok")})
		held := claimParams(tenant, "held", "fp")
		mustClaim(t, env.store, held, true)
		// Back to the schema before 0003.
		for _, q := range []string{`ALTER TABLE idem_keys DROP COLUMN steps`, `DELETE FROM idem_schema_migrations WHERE version = 3`} {
			if _, err := env.db.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		if env.dialect == idemmysql.Dialect {
			// MySQL commits DDL by itself: a run stopped after the ALTER
			// and before the record runs the file again.
			if _, err := env.db.ExecContext(ctx, `ALTER TABLE idem_keys ADD COLUMN steps LONGBLOB`); err != nil {
				t.Fatal(err)
			}
		}
		if err := migrate(ctx, env); err != nil {
			t.Fatalf("migrate forward: %v", err)
		}
		if err := migrate(ctx, env); err != nil {
			t.Fatalf("migrate again: %v", err)
		}
		engine := newEngine(t, env.store, nil)
		out, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: "done", Fingerprint: []byte("fp")}, func(context.Context) (idem.Result, error) {
			return idem.Result{}, errors.New("ran again")
		})
		if err != nil || !out.Replayed || string(out.Result.Body) != "ok" {
			t.Fatalf("replay after the migration: %+v, %v", out, err)
		}
		if err := saveStep(ctx, env.store, held, "charge", `1`); err != nil {
			t.Fatalf("SaveStep on a record from before the migration: %v", err)
		}
		if got := stepNames(mustGet(t, env.store, tenant, "held").Steps); !slices.Equal(got, []string{"charge"}) {
			t.Fatalf("steps %q", got)
		}
	})
}

// migrate runs idemmigrate on env's database.
func migrate(ctx context.Context, env *testDB) error {
	return idemmigrate.Migrate(ctx, env.db, env.dialect.MigrateDialect())
}

// TestStepFencedUnderOwnLock: on SQLite, a step saved while the
// execution's own transaction holds the write lock goes to the journal
// only if the execution still holds the key: one taken over before its
// transaction began gets idem.ErrLeaseLost, and nothing is recorded.
func TestStepFencedUnderOwnLock(t *testing.T) {
	t.Parallel()
	env := newTestDB(t, idemsql.SQLite)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine := newEngine(t, env.store, &idem.Config{Lease: shortLease, Heartbeat: -1})
	op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1", Fingerprint: []byte("fp")}
	var stepErr error
	var steps stepCounter
	_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		x, _ := idem.ExecutionFromContext(ctx)
		time.Sleep(shortLease + slack)
		taker := claimParams(op.Tenant, op.Key, "fp")
		if res, err := env.peer.Claim(ctx, taker); err != nil || !res.Won {
			return idem.Result{}, fmt.Errorf("takeover: %+v, %v", res, err)
		}
		if err := env.businessWrite(ctx, "x"); err != nil { // the lock, now
			return idem.Result{}, err
		}
		_, stepErr = idem.Step(ctx, "charge", steps.charge)
		if rec := mustGet(t, env.store, op.Tenant, op.Key); rec.LeaseToken == x.LeaseToken || len(rec.Steps) != 0 {
			t.Errorf("record %+v: the step of the execution taken over was recorded", rec)
		}
		return idem.Result{Status: 200}, nil
	})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Do = %v, want idem.ErrLeaseLost", err)
	}
	if !errors.Is(stepErr, idem.ErrStepNotSaved) || !errors.Is(stepErr, idem.ErrLeaseLost) {
		t.Fatalf("Step = %v, want ErrStepNotSaved and ErrLeaseLost", stepErr)
	}
	if n := journalRows(t, env, op.Tenant); n != 0 {
		t.Fatalf("the journal holds %d rows of the execution taken over", n)
	}
}

// TestReplayIsOneRead: the replay of a complete record sends one
// statement, a read.
func TestReplayIsOneRead(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		db, log := openLogged(t, env)
		engine := newEngine(t, testenv.Must(idemsql.NewStore(db, env.dialect)), nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "order-1", Fingerprint: []byte("fp")}
		if _, err := engine.Do(ctx, op, func(context.Context) (idem.Result, error) { return idem.Result{Status: 201}, nil }); err != nil {
			t.Fatal(err)
		}
		log.take()
		out, err := engine.Do(ctx, op, func(context.Context) (idem.Result, error) { return idem.Result{}, errors.New("ran again") })
		if err != nil || !out.Replayed {
			t.Fatalf("Do = %+v, %v; want a replay", out, err)
		}
		if got := kinds(log.take()); !slices.Equal(got, []string{"peek"}) {
			t.Fatalf("the replay sent %q, want one read", got)
		}
	})
}

// TestReplayTakesNoLock: a replay neither takes nor waits for a lock: it
// answers while another session holds the record's row locked
// (PostgreSQL, MySQL), or while another execution's transaction holds
// SQLite's write lock. A claim statement would wait.
func TestReplayTakesNoLock(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "order-1", Fingerprint: []byte("fp")}
		if _, err := engine.Do(ctx, op, func(context.Context) (idem.Result, error) { return idem.Result{Status: 201}, nil }); err != nil {
			t.Fatal(err)
		}
		release := make(chan struct{})
		held := make(chan error, 1)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer close(release)
		wg.Go(func() {
			if env.dialect == idemsql.SQLite {
				_, err := engine.Do(ctx, idem.Operation{Tenant: op.Tenant, Key: "holder"}, func(ctx context.Context) (idem.Result, error) {
					err := env.businessWrite(ctx, "holder") // BEGIN IMMEDIATE: the write lock
					held <- err
					<-release
					return idem.Result{Status: 200}, err
				})
				if err != nil {
					t.Error(err)
				}
				return
			}
			tx, err := env.peerDB.BeginTx(ctx, nil)
			if err == nil {
				var one int
				err = tx.QueryRowContext(ctx, `SELECT 1 FROM idem_keys WHERE tenant_id = `+env.placeholder()+` AND idem_key = 'order-1' FOR UPDATE`, op.Tenant).Scan(&one)
			}
			held <- err
			<-release
			if tx != nil {
				_ = tx.Rollback()
			}
		})
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		// Far below the busy timeout and the lock wait timeouts.
		bounded, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		out, err := engine.Do(bounded, op, func(context.Context) (idem.Result, error) { return idem.Result{}, errors.New("ran again") })
		if err != nil || !out.Replayed {
			t.Fatalf("replay while the lock is held: %+v, %v", out, err)
		}
	})
}

// TestStepOrderAcrossRollback: steps keep the order they were saved in
// when the handler rolls its transaction back between two of them (on
// SQLite the first went to the journal, the second to the record).
func TestStepOrderAcrossRollback(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1"}
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, "x"); err != nil {
				return idem.Result{}, err
			}
			if _, err := idem.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return idem.Result{}, err
			}
			if err := idemsql.TxFromContext(ctx).Rollback(); err != nil {
				return idem.Result{}, err
			}
			if _, err := idem.Step(ctx, "second", func(context.Context) (int, error) { return 2, nil }); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 402}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := stepNames(mustGet(t, env.store, op.Tenant, op.Key).Steps); !slices.Equal(got, []string{"first", "second"}) {
			t.Fatalf("steps %q, want first then second", got)
		}
	})
}

// TestStepWithOneConnection: on SQLite with a pool of one connection, the
// handler's transaction holds the only one when it saves a step: the step
// is saved without another.
func TestStepWithOneConnection(t *testing.T) {
	t.Parallel()
	env := newTestDB(t, idemsql.SQLite)
	env.db.SetMaxOpenConns(1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine := newEngine(t, env.store, nil)
	op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1"}
	failure := errors.New("failed after the charge")
	var steps stepCounter
	for _, want := range []error{failure, nil} {
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, "x"); err != nil {
				return idem.Result{}, err
			}
			if _, err := idem.Step(ctx, "charge", steps.charge); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201}, want
		})
		if !errors.Is(err, want) {
			t.Fatalf("Do = %v, want %v", err, want)
		}
	}
	if n := steps.runs.Load(); n != 1 {
		t.Fatalf("the charge ran %d times", n)
	}
}

// TestAsyncClaimRestoresSync: on SQLite a claim of a new key commits
// without waiting for the disk, and puts its connection's synchronous
// setting back: no other transaction on the pool ever commits so.
func TestAsyncClaimRestoresSync(t *testing.T) {
	t.Parallel()
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	tenant := newName("tenant")
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			if _, err := env.store.Claim(ctx, claimParams(tenant, fmt.Sprint("order-", i), "fp")); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	open := env.db.Stats().OpenConnections
	conns := make([]*sql.Conn, open)
	for i := range conns {
		conns[i] = testenv.Must(env.db.Conn(ctx))
		defer conns[i].Close()
	}
	for i, c := range conns {
		var sync int
		if err := c.QueryRowContext(ctx, `PRAGMA synchronous`).Scan(&sync); err != nil {
			t.Fatal(err)
		}
		if sync != 2 {
			t.Errorf("connection %d of %d: synchronous = %d after the claims, want 2 (FULL)", i, open, sync)
		}
	}
}
