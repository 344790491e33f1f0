package idemsql_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
)

// singleEngine is an engine on env's store, in the single-transaction mode.
func singleEngine(t *testing.T, env *testDB) *idem.Engine {
	t.Helper()
	eng := testenv.Must(idem.NewEngine(env.store, nil))
	t.Cleanup(func() { _ = eng.Close(context.Background()) })
	return eng
}

// forEachSingleDialect runs fn per dialect on stores in the
// single-transaction mode.
func forEachSingleDialect(t *testing.T, fn func(t *testing.T, env *testDB, eng *idem.Engine)) {
	t.Parallel()
	for _, d := range dialects {
		t.Run(d.Name(), func(t *testing.T) {
			t.Parallel()
			env := newSingleTestDB(t, d)
			fn(t, env, singleEngine(t, env))
		})
	}
}

// hold runs op on eng until release, its handler writing the business
// row op.Key and answering 201 "done", and returns once the handler runs;
// the channel gets Do's error.
func hold(eng *idem.Engine, env *testDB, op idem.Operation, release <-chan struct{}) <-chan error {
	running, first := make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := eng.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, op.Key); err != nil {
				return idem.Result{}, err
			}
			close(running)
			<-release
			return idem.Result{Status: 201, Body: []byte("done")}, nil
		})
		first <- err
	}()
	<-running
	return first
}

// after is closed d from now.
func after(d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	time.AfterFunc(d, func() { close(c) })
	return c
}

// TestSingleTransactionInfo: the option shows in the store's Info, which
// is what makes the engine claim inside the unit of work.
func TestSingleTransactionInfo(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	if env.store.Info().SingleTransaction {
		t.Error("a Store without the option reports SingleTransaction")
	}
	single := testenv.Must(idemsql.NewStore(env.db, idemsql.SQLite, idemsql.SingleTransaction()))
	if !single.Info().SingleTransaction {
		t.Error("a Store with SingleTransaction() does not report it")
	}
	if _, _, err := env.store.ClaimUnit(context.Background(), idem.ClaimParams{Key: "k", Token: 1, Lease: time.Second, Retention: time.Hour}, 0); err == nil {
		t.Error("ClaimUnit on a Store in the default mode succeeded")
	}
}

// TestSingleTransactionDuplicatesAtOnce releases duplicates of one key at
// one barrier: one runs, the others wait for its transaction and get its
// answer; one business row.
func TestSingleTransactionDuplicatesAtOnce(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		const n = 12
		for round := range 3 {
			key, ref := fmt.Sprintf("dup-%d", round), fmt.Sprintf("order-%d", round)
			op := idem.Operation{Key: key, Fingerprint: []byte("POST /orders"), WaitInFlight: 30 * time.Second}
			var ran atomic.Int32
			outs := make([]idem.Outcome, n)
			errs := make([]error, n)
			atOnce(n, func(i int) {
				outs[i], errs[i] = eng.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
					ran.Add(1)
					if err := env.businessWrite(ctx, ref); err != nil {
						return idem.Result{}, err
					}
					time.Sleep(20 * time.Millisecond) // the others arrive while it runs
					return idem.Result{Status: 201, Body: []byte(ref)}, nil
				})
			})
			fresh, replayed := 0, 0
			for i := range n {
				if errs[i] != nil {
					t.Fatalf("round %d, duplicate %d: %v", round, i, errs[i])
				}
				if string(outs[i].Result.Body) != ref || outs[i].Result.Status != 201 {
					t.Errorf("round %d, duplicate %d answered %+v", round, i, outs[i].Result)
				}
				if outs[i].Replayed {
					replayed++
				} else {
					fresh++
				}
			}
			if ran.Load() != 1 || fresh != 1 || replayed != n-1 {
				t.Errorf("round %d: handler ran %d times, %d fresh, %d replayed; want 1, 1, %d", round, ran.Load(), fresh, replayed, n-1)
			}
			if got := testenv.Must(env.businessCount(context.Background(), ref)); got != 1 {
				t.Errorf("round %d: %d business rows, want 1", round, got)
			}
		}
	})
}

// TestSingleTransactionWaitLimit: a duplicate that outlives its wait limit
// gets idem.ErrInFlight (409), one without a wait limit too; the execution
// in flight is invisible; once it commits, a retry gets its answer.
func TestSingleTransactionWaitLimit(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		ctx := context.Background()
		op := idem.Operation{Key: "slow", Fingerprint: []byte("POST /orders")}
		release := make(chan struct{})
		first := hold(eng, env, op, release)
		for _, wait := range []time.Duration{0, 100 * time.Millisecond} {
			dup := op
			dup.WaitInFlight = wait
			start := time.Now()
			_, err := eng.Do(ctx, dup, func(context.Context) (idem.Result, error) {
				t.Error("the duplicate ran")
				return idem.Result{}, nil
			})
			if !errors.Is(err, idem.ErrInFlight) {
				t.Fatalf("duplicate with WaitInFlight %s = %v, want idem.ErrInFlight", wait, err)
			}
			if wait > 0 && time.Since(start) < wait {
				t.Errorf("duplicate with WaitInFlight %s gave up after %s", wait, time.Since(start))
			}
		}
		if _, err := env.store.Get(ctx, "", "slow"); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get of a key in flight = %v, want idem.ErrNotFound (the execution is not committed)", err)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatalf("first execution: %v", err)
		}
		out, err := eng.Do(ctx, op, func(context.Context) (idem.Result, error) {
			t.Error("the retry ran")
			return idem.Result{}, nil
		})
		if err != nil || !out.Replayed || string(out.Result.Body) != "done" {
			t.Fatalf("retry after the commit = %+v, %v; want the replay", out, err)
		}
		if got := testenv.Must(env.businessCount(ctx, "slow")); got != 1 {
			t.Errorf("%d business rows, want 1", got)
		}
	})
}

// TestSingleTransactionWaitBelowASecond: a wait limit below a second is
// kept, not rounded up to one (MariaDB's lock wait timeout counts whole
// seconds): a duplicate waiting 200 ms for a holder that commits after
// 800 ms gets idem.ErrInFlight, and does not replay.
func TestSingleTransactionWaitBelowASecond(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		ctx := context.Background()
		op := idem.Operation{Key: "sub-second", Fingerprint: []byte("POST /orders")}
		first := hold(eng, env, op, after(800*time.Millisecond))
		dup := op
		dup.WaitInFlight = 200 * time.Millisecond
		out, err := eng.Do(ctx, dup, func(context.Context) (idem.Result, error) {
			t.Error("the duplicate ran")
			return idem.Result{}, nil
		})
		if !errors.Is(err, idem.ErrInFlight) {
			t.Errorf("duplicate with WaitInFlight 200ms, holder committing after 800ms = %+v, %v; want idem.ErrInFlight", out, err)
		}
		if err := <-first; err != nil {
			t.Fatalf("first execution: %v", err)
		}
	})
}

// TestSingleTransactionWaitLimitAcrossProcesses: a duplicate claimed
// through another Store on its own pool (another process) keeps its wait
// limit too: on SQLite it waits for the database's write lock, which the
// holder's transaction keeps, at most that long (not the busy timeout),
// then gets idem.ErrInFlight; once the holder committed, it replays.
func TestSingleTransactionWaitLimitAcrossProcesses(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		ctx := context.Background()
		other := testenv.Must(idem.NewEngine(env.peer, nil))
		t.Cleanup(func() { _ = other.Close(context.Background()) })
		op := idem.Operation{Key: "across", Fingerprint: []byte("POST /orders")}
		// The holder commits long after the wait limit: a duplicate that
		// waited for it would replay instead of giving up.
		first := hold(eng, env, op, after(2*time.Second))
		dup := op
		dup.WaitInFlight = 200 * time.Millisecond
		out, err := other.Do(ctx, dup, func(context.Context) (idem.Result, error) {
			t.Error("the duplicate ran")
			return idem.Result{}, nil
		})
		if !errors.Is(err, idem.ErrInFlight) {
			t.Errorf("duplicate in another process, WaitInFlight 200ms, holder committing after 2s = %+v, %v; want idem.ErrInFlight", out, err)
		}
		if err := <-first; err != nil {
			t.Fatalf("first execution: %v", err)
		}
		out, err = other.Do(ctx, op, func(context.Context) (idem.Result, error) {
			t.Error("the retry ran")
			return idem.Result{}, nil
		})
		if err != nil || !out.Replayed || string(out.Result.Body) != "done" {
			t.Fatalf("retry in the other process after the commit = %+v, %v; want the replay", out, err)
		}
	})
}

// TestSingleTransactionWaitLimitQueued: claims that queue in one Store
// behind each other while another process's transaction holds a key (on
// SQLite, the database's only write lock) keep their wait limits: a
// duplicate of that key, and claims of other keys sent with it, each end
// about their limit after they began (idem.ErrInFlight where the holder
// keeps them out), not after the limits of the claims queued before them
// as well.
func TestSingleTransactionWaitLimitQueued(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		ctx := context.Background()
		other := testenv.Must(idem.NewEngine(env.peer, nil))
		t.Cleanup(func() { _ = other.Close(context.Background()) })
		fp := []byte("POST /orders")
		release := make(chan struct{})
		first := hold(eng, env, idem.Operation{Key: "queued", Fingerprint: fp}, release)
		// Released once the claims below ended (or failed the test).
		timer := time.AfterFunc(10*time.Second, func() { close(release) })
		defer timer.Stop()
		const n, wait = 4, time.Second
		took := make([]time.Duration, n)
		errs := make([]error, n)
		atOnce(n, func(i int) {
			// The first is the duplicate; the others claim keys of their
			// own, which only SQLite's one write lock keeps out.
			key := "queued"
			if i > 0 {
				key = fmt.Sprintf("queued-other-%d", i)
			}
			start := time.Now()
			_, errs[i] = other.Do(ctx, idem.Operation{Key: key, Fingerprint: fp, WaitInFlight: wait}, func(context.Context) (idem.Result, error) {
				if i == 0 {
					t.Error("the duplicate ran")
				}
				return idem.Result{Status: 201}, nil
			})
			took[i] = time.Since(start)
		})
		for i := range n {
			// A second of slack for a busy machine; queued one after the
			// other, the last would end after n seconds.
			if (errs[i] != nil && !errors.Is(errs[i], idem.ErrInFlight)) || (i == 0 && errs[i] == nil) || took[i] > 2*wait {
				t.Errorf("claim %d of %d in another process (0: the duplicate), WaitInFlight %v: %v after %v; want it within about %v (the duplicate: idem.ErrInFlight)", i, n, wait, errs[i], took[i].Round(time.Millisecond), wait)
			}
		}
		if timer.Stop() {
			close(release)
		}
		if err := <-first; err != nil {
			t.Fatalf("first execution: %v", err)
		}
	})
}

// TestSingleTransactionEndings: a handler error frees the key and leaves
// nothing; a handler that rolls its writes back has its answer stored
// alone; a duplicate waiting on a holder that fails runs afresh.
func TestSingleTransactionEndings(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		ctx := context.Background()
		boom := errors.New("boom")
		op := idem.Operation{Key: "fails", Fingerprint: []byte("f")}
		if _, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, "fails"); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{}, boom
		}); !errors.Is(err, boom) {
			t.Fatalf("failing handler: %v, want boom", err)
		}
		if _, err := env.store.Get(ctx, "", "fails"); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get after a failed handler = %v, want idem.ErrNotFound", err)
		}
		if n := testenv.Must(env.businessCount(ctx, "fails")); n != 0 {
			t.Errorf("failed handler left %d business rows", n)
		}

		op = idem.Operation{Key: "rolled", Fingerprint: []byte("r")}
		out, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, "rolled"); err != nil {
				return idem.Result{}, err
			}
			if err := idemsql.TxFromContext(ctx).Rollback(); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 422, Body: []byte("refused")}, nil
		})
		if err != nil || out.Result.Status != 422 {
			t.Fatalf("handler that rolled back = %+v, %v; want its 422", out, err)
		}
		rec := testenv.Must(env.store.Get(ctx, "", "rolled"))
		if rec.State != idem.StateComplete || rec.Result.Status != 422 || string(rec.Result.Body) != "refused" {
			t.Errorf("record after the handler's rollback = %+v, want the 422 stored", rec)
		}
		if n := testenv.Must(env.businessCount(ctx, "rolled")); n != 0 {
			t.Errorf("rolled-back handler left %d business rows", n)
		}

		// A duplicate waits for a holder that then fails: it claims and
		// runs once the holder's transaction rolls back.
		op = idem.Operation{Key: "retaken", Fingerprint: []byte("t"), WaitInFlight: 30 * time.Second}
		running, release := make(chan struct{}), make(chan struct{})
		first := make(chan error, 1)
		go func() {
			_, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if err := env.businessWrite(ctx, "retaken-first"); err != nil {
					return idem.Result{}, err
				}
				close(running)
				<-release
				return idem.Result{}, boom
			})
			first <- err
		}()
		<-running
		second := make(chan error, 1)
		var out2 idem.Outcome
		go func() {
			var err error
			out2, err = eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if err := env.businessWrite(ctx, "retaken-second"); err != nil {
					return idem.Result{}, err
				}
				return idem.Result{Status: 201, Body: []byte("second")}, nil
			})
			second <- err
		}()
		time.Sleep(50 * time.Millisecond) // the duplicate reaches its wait (a pause, not asserted)
		close(release)
		if err := <-first; !errors.Is(err, boom) {
			t.Fatalf("holder: %v, want boom", err)
		}
		if err := <-second; err != nil || out2.Replayed || string(out2.Result.Body) != "second" {
			t.Fatalf("duplicate after the holder failed = %+v, %v; want its own run", out2, err)
		}
		if n := testenv.Must(env.businessCount(ctx, "retaken-first")); n != 0 {
			t.Errorf("failed holder left %d business rows", n)
		}
		if n := testenv.Must(env.businessCount(ctx, "retaken-second")); n != 1 {
			t.Errorf("%d business rows of the duplicate, want 1", n)
		}
	})
}

// TestSingleTransactionPairsRunOnce sends many keys twice at one barrier:
// every pair runs once.
func TestSingleTransactionPairsRunOnce(t *testing.T) {
	forEachSingleDialect(t, func(t *testing.T, env *testDB, eng *idem.Engine) {
		const keys = 20
		var ran atomic.Int32
		errs := make([]error, 2*keys)
		atOnce(2*keys, func(i int) {
			k := i / 2
			op := idem.Operation{Key: fmt.Sprintf("pair-%d", k), Fingerprint: []byte("p"), WaitInFlight: 30 * time.Second}
			_, errs[i] = eng.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
				ran.Add(1)
				return idem.Result{Status: 201}, env.businessWrite(ctx, fmt.Sprintf("pair-%d", k))
			})
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		if n := ran.Load(); n != keys {
			t.Errorf("handlers ran %d times for %d keys", n, keys)
		}
		for k := range keys {
			if n := testenv.Must(env.businessCount(context.Background(), fmt.Sprintf("pair-%d", k))); n != 1 {
				t.Errorf("key %d: %d business rows, want 1", k, n)
			}
		}
	})
}
