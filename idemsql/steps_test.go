package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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
			if !stepFirst && env.dialect == idemsql.SQLite {
				// Refused there (TestSQLiteStepAfterStatement).
				continue
			}
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
// succeeds are kept by the complete record, a step after the handler's
// write included (where the dialect allows one: not SQLite).
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
			write := func() error { return env.businessWrite(ctx, newName("order")) }
			if env.dialect != idemsql.SQLite {
				if err := write(); err != nil {
					return idem.Result{}, err
				}
			}
			if _, err := idem.Step(ctx, "charge", (&stepCounter{}).charge); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201}, write()
		})
		if err != nil {
			t.Fatal(err)
		}
		rec := mustGet(t, env.store, op.Tenant, op.Key)
		if rec.State != idem.StateComplete || !slices.Equal(stepNames(rec.Steps), []string{"reserve", "charge"}) {
			t.Fatalf("record %+v, want complete with reserve then charge", rec)
		}
	})
}

// TestStepTakeoverAfterCrash: a process records a step and dies before its
// transaction ends (on SQLite, with the write lock held). Once the lease has ended, another process takes the key over
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
	})
}

// helperStepCrash runs an execution that writes, records a step, and dies
// before its transaction ends. On SQLite the step comes first, as it must
// there.
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
			write := func() error { return env.businessWrite(ctx, tenant+"-crash") }
			if env.dialect != idemsql.SQLite {
				if err := write(); err != nil {
					return idem.Result{}, err
				}
			}
			if _, err := idem.Step(ctx, "charge", func(context.Context) (charge, error) { return charge{ID: "ch_crashed"}, nil }); err != nil {
				return idem.Result{}, err
			}
			if env.dialect == idemsql.SQLite {
				if err := write(); err != nil {
					return idem.Result{}, err
				}
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

// TestSQLiteStepAfterStatement: on SQLite, a step made after the
// handler's first statement on its Tx (a write, or a read: the
// transaction begins IMMEDIATE, holding the write lock) is refused before
// its function runs, with ErrStepAfterStatement, not ErrStepNotSaved:
// no effect happened. After Tx.Rollback, which gives the lock up, a step
// may come again.
func TestSQLiteStepAfterStatement(t *testing.T) {
	t.Parallel()
	env := newTestDB(t, idemsql.SQLite)
	// Bounded: a step that waited for its own transaction's lock would
	// hang until the busy timeout.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	engine := newEngine(t, env.store, nil)
	for _, first := range []string{"write", "read"} {
		t.Run(first, func(t *testing.T) {
			op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1", Fingerprint: []byte("fp")}
			var steps stepCounter
			var refused, after error
			out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				tx := idemsql.TxFromContext(ctx)
				if first == "write" {
					if err := env.businessWrite(ctx, "x"); err != nil {
						return idem.Result{}, err
					}
				} else {
					var n int
					if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM business`).Scan(&n); err != nil {
						return idem.Result{}, err
					}
				}
				_, refused = idem.Step(ctx, "charge", steps.charge)
				if err := tx.Rollback(); err != nil {
					return idem.Result{}, err
				}
				_, after = idem.Step(ctx, "receipt", steps.charge)
				return idem.Result{Status: 402}, nil
			})
			if err != nil || out.Result.Status != 402 {
				t.Fatalf("Do = %+v, %v; want the handler's 402", out, err)
			}
			if !errors.Is(refused, idemsql.ErrStepAfterStatement) || errors.Is(refused, idem.ErrStepNotSaved) {
				t.Errorf("Step after a %s = %v, want ErrStepAfterStatement and not ErrStepNotSaved", first, refused)
			}
			if after != nil {
				t.Errorf("Step after Tx.Rollback = %v, want it recorded", after)
			}
			if n := steps.runs.Load(); n != 1 {
				t.Errorf("the steps' functions ran %d times, want once (the refused one never)", n)
			}
			if got := stepNames(mustGet(t, env.store, op.Tenant, op.Key).Steps); !slices.Equal(got, []string{"receipt"}) {
				t.Errorf("steps %q, want only the receipt", got)
			}
		})
	}
}

// TestSQLiteStepWaitsAsAClaim: on SQLite, a step made before any write
// waits for the write lock another key's handler holds as long as a claim
// would (the busy timeout), not the engine's shorter CleanupTimeout: a step
// that gave up first would leave its key held with no record of an effect
// that stands, and its takeover would run it again. The duplicate sent
// while the step waits is told the key is in flight, and the record has
// the step.
func TestSQLiteStepWaitsAsAClaim(t *testing.T) {
	t.Parallel()
	env := newTestDB(t, idemsql.SQLite)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const cleanup = 50 * time.Millisecond
	engine := newEngine(t, env.store, &idem.Config{CleanupTimeout: cleanup})
	tenant := newName("tenant")

	// The payment claims its key, then another key's handler takes the
	// write lock and keeps it, then the payment charges the card.
	op := idem.Operation{Tenant: tenant, Key: "pay-1", Fingerprint: []byte("fp")}
	var steps stepCounter
	claimed := make(chan struct{})
	goOn := make(chan struct{})
	charged := make(chan struct{})
	payErr := make(chan error, 1)
	go func() {
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			close(claimed)
			<-goOn
			_, err := idem.Step(ctx, "charge", func(ctx context.Context) (charge, error) {
				defer close(charged)
				return steps.charge(ctx)
			})
			if err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201}, env.businessWrite(ctx, "pay-1")
		})
		payErr <- err
	}()
	<-claimed

	locked := make(chan error, 1)
	unlock := make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: "other"}, func(ctx context.Context) (idem.Result, error) {
			err := env.businessWrite(ctx, "other")
			locked <- err
			<-unlock
			return idem.Result{Status: 201}, err
		})
		holder <- err
	}()
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	close(goOn)
	<-charged
	// The step's record now waits for the lock; a duplicate comes too.
	dupErr := make(chan error, 1)
	go func() {
		_, err := engine.Do(ctx, op, func(context.Context) (idem.Result, error) {
			return idem.Result{}, errors.New("the duplicate ran")
		})
		dupErr <- err
	}()
	// Hold the lock well past CleanupTimeout, far below the busy timeout.
	time.Sleep(10 * cleanup)
	close(unlock)
	if err := <-holder; err != nil {
		t.Fatalf("the holder: %v", err)
	}
	if err := <-payErr; err != nil {
		t.Fatalf("Do with the step = %v, want its completion: the step's record must wait for the lock", err)
	}
	if err := <-dupErr; err != nil && !errors.Is(err, idem.ErrInFlight) {
		t.Fatalf("the duplicate = %v, want ErrInFlight or the replay", err)
	}
	if n := steps.runs.Load(); n != 1 {
		t.Fatalf("the charge ran %d times, want once", n)
	}
	rec := mustGet(t, env.store, op.Tenant, op.Key)
	if rec.State != idem.StateComplete || !slices.Equal(stepNames(rec.Steps), []string{"charge"}) {
		t.Fatalf("record %+v, want complete with the charge", rec)
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
		want := []string{"peek"}
		if isMariaDB(t, env) {
			// The read, and the claim that it skips for a replay.
			want = []string{"peek and claim"}
		}
		if got := kinds(log.take()); !slices.Equal(got, want) {
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
// SQLite the first comes before the write, as it must there).
func TestStepOrderAcrossRollback(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1"}
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			write := func() error { return env.businessWrite(ctx, "x") }
			if env.dialect != idemsql.SQLite {
				if err := write(); err != nil {
					return idem.Result{}, err
				}
			}
			if _, err := idem.Step(ctx, "first", func(context.Context) (int, error) { return 1, nil }); err != nil {
				return idem.Result{}, err
			}
			if env.dialect == idemsql.SQLite {
				if err := write(); err != nil {
					return idem.Result{}, err
				}
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

// TestStepWithOneConnection: on SQLite with a pool of one connection, a
// step before the handler's first statement is saved on that connection,
// and one after it, while the transaction holds the only connection, is
// refused at once instead of waiting for a connection that never comes.
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
			if _, err := idem.Step(ctx, "charge", steps.charge); err != nil {
				return idem.Result{}, err
			}
			if err := env.businessWrite(ctx, "x"); err != nil {
				return idem.Result{}, err
			}
			if _, err := idem.Step(ctx, "late", steps.charge); !errors.Is(err, idemsql.ErrStepAfterStatement) {
				return idem.Result{}, fmt.Errorf("a step after the write: %v, want ErrStepAfterStatement", err)
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

// TestSQLiteStepRecordedAfterLongHold: on SQLite, a step made before any
// write whose record gives up (another key's handler holds the write lock
// longer than the busy timeout) is recorded once the lock is free, while
// the engine keeps the key: the duplicates meanwhile are told it is in
// flight, and the one that takes it over gets the charge instead of
// charging again.
func TestSQLiteStepRecordedAfterLongHold(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	env := newTestDBAt(t, idemsql.SQLite, path)
	// A busy timeout the test outlasts.
	db := sqlOpen(t, "sqlite", "file:"+(&url.URL{Path: path}).EscapedPath()+"?_pragma=busy_timeout(200)&_pragma=journal_mode(WAL)&_txlock=immediate")
	defer db.Close()
	store := testenv.Must(idemsql.NewStore(db, idemsql.SQLite))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	engine := newEngine(t, store, &idem.Config{Lease: 30 * time.Second})
	tenant := newName("tenant")
	op := idem.Operation{Tenant: tenant, Key: "pay-1", Fingerprint: []byte("fp")}
	var steps stepCounter
	pay := func(ctx context.Context) (idem.Result, error) {
		c, err := idem.Step(ctx, "charge", steps.charge)
		if err != nil {
			return idem.Result{}, err
		}
		tx := idemsql.TxFromContext(ctx)
		if _, err := tx.ExecContext(ctx, `INSERT INTO business (id) VALUES (?)`, "pay-1"); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201, Body: []byte(c.ID)}, nil
	}

	claimed := make(chan struct{})
	goOn := make(chan struct{})
	payErr := make(chan error, 1)
	go func() {
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			close(claimed)
			<-goOn
			return pay(ctx)
		})
		payErr <- err
	}()
	<-claimed
	locked := make(chan error, 1)
	unlock := make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		_, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: "other"}, func(ctx context.Context) (idem.Result, error) {
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO business (id) VALUES (?)`, "other")
			locked <- err
			<-unlock
			return idem.Result{Status: 201}, err
		})
		holder <- err
	}()
	if err := <-locked; err != nil {
		t.Fatal(err)
	}
	close(goOn)
	if err := <-payErr; !errors.Is(err, idem.ErrStepNotSaved) {
		t.Fatalf("Do whose step's record waited past the busy timeout = %v, want ErrStepNotSaved", err)
	}
	// A duplicate meanwhile: the key is held (or, its claim waiting past
	// the busy timeout too, the store is unavailable); it never runs.
	if _, err := engine.Do(ctx, op, pay); !errors.Is(err, idem.ErrInFlight) && !errors.Is(err, idem.ErrStore) {
		t.Fatalf("a duplicate while the lock is held = %v, want ErrInFlight or a store error", err)
	}
	close(unlock)
	if err := <-holder; err != nil {
		t.Fatalf("the holder: %v", err)
	}
	for {
		out, err := engine.Do(ctx, op, pay)
		if errors.Is(err, idem.ErrInFlight) && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil || string(out.Result.Body) != "ch_1" {
			t.Fatalf("the retry after the lock was freed = %+v, %v; want the recorded charge", out, err)
		}
		break
	}
	if n := steps.runs.Load(); n != 1 {
		t.Fatalf("the charge ran %d times, want once", n)
	}
	mustCount(t, env, "pay-1", 1)
}
