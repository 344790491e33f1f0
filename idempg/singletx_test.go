package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/idem-go/idem/internal/testenv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/atonce"
	"github.com/jackc/pgx/v5/pgconn"
)

// newSingleEnv is an env whose stores run in the single-transaction mode.
func newSingleEnv(t *testing.T, maxConns int32) (*env, *idem.Engine) {
	t.Helper()
	e := newEnvWith(t, maxConns, &idempg.Config{SingleTransaction: true})
	eng := testenv.Must(idem.NewEngine(e.store, nil))
	t.Cleanup(func() { _ = eng.Close(context.Background()) })
	return e, eng
}

// heldLocks counts the advisory locks held by the connections of e.pool,
// read on each of them: pg_locks is server-wide, and other tests share the
// server.
func (e *env) heldLocks(t *testing.T) int {
	t.Helper()
	ctx := context.Background()
	conns := e.pool.AcquireAllIdle(ctx)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	n := 0
	for _, c := range conns {
		var k int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&k); err != nil {
			t.Fatalf("count advisory locks: %v", err)
		}
		n += k
	}
	return n
}

// TestSingleTransactionDuplicatesAtOnce releases duplicates of one key at
// one barrier: one runs, the others wait for its transaction and get its
// answer; one business row.
func TestSingleTransactionDuplicatesAtOnce(t *testing.T) {
	e, eng := newSingleEnv(t, 20)
	const n = 16
	for round := range 5 {
		key, ref := fmt.Sprintf("dup-%d", round), fmt.Sprintf("order-%d", round)
		op := idem.Operation{Key: key, Fingerprint: []byte("POST /orders"), WaitInFlight: 30 * time.Second}
		var ran atomic.Int32
		outs := make([]idem.Outcome, n)
		errs := make([]error, n)
		atonce.Run(n, func(i int) {
			outs[i], errs[i] = eng.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
				ran.Add(1)
				if err := insertOrder(ctx, ref); err != nil {
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
		if got := e.countOrders(t, ref); got != 1 {
			t.Errorf("round %d: %d orders, want 1", round, got)
		}
	}
	if n := e.heldLocks(t); n != 0 {
		t.Errorf("%d advisory locks still held by idle pool connections", n)
	}
}

// TestSingleTransactionWaitLimit: a duplicate that outlives its wait limit
// gets idem.ErrInFlight (409), one without a wait limit at once; once the
// first execution commits, a retry gets its answer.
func TestSingleTransactionWaitLimit(t *testing.T) {
	e, eng := newSingleEnv(t, 8)
	ctx := context.Background()
	op := idem.Operation{Key: "slow", Fingerprint: []byte("POST /orders")}
	running, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := insertOrder(ctx, "slow"); err != nil {
				return idem.Result{}, err
			}
			close(running)
			<-release
			return idem.Result{Status: 201, Body: []byte("done")}, nil
		})
		first <- err
	}()
	<-running
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
	// Invisible while in flight: nothing committed yet.
	if _, err := e.store.Get(ctx, "", "slow"); !errors.Is(err, idem.ErrNotFound) {
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
	if got := e.countOrders(t, "slow"); got != 1 {
		t.Errorf("%d orders, want 1", got)
	}
	if n := e.heldLocks(t); n != 0 {
		t.Errorf("%d advisory locks still held by idle pool connections", n)
	}
}

// TestSingleTransactionEndings: every way an execution ends leaves the
// key's lock free and the record as the default mode would.
func TestSingleTransactionEndings(t *testing.T) {
	e, eng := newSingleEnv(t, 4)
	ctx := context.Background()
	boom := errors.New("boom")
	cases := []struct {
		name    string
		fn      func(ctx context.Context, ref string) (idem.Result, error)
		wantErr error // nil: success
		stored  bool  // a record is kept
		orders  int
	}{
		{"commit", func(ctx context.Context, ref string) (idem.Result, error) {
			return idem.Result{Status: 201}, insertOrder(ctx, ref)
		}, nil, true, 1},
		{"no query", func(ctx context.Context, ref string) (idem.Result, error) {
			return idem.Result{Status: 200}, nil
		}, nil, true, 0},
		{"error", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			return idem.Result{}, boom
		}, boom, false, 0},
		{"panic", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			panic("boom")
		}, &idem.PanicError{}, false, 0},
		{"RollbackWrites", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			idem.RollbackWrites(ctx)
			return idem.Result{Status: 402}, nil
		}, nil, true, 0},
		{"Tx.Rollback", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			if err := idempg.TxFromContext(ctx).Rollback(ctx); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 402}, nil
		}, nil, true, 0},
		{"aborted, 409 answered", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			_, err := idempg.TxFromContext(ctx).Exec(ctx, `SELECT 1/0`)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) {
				return idem.Result{}, fmt.Errorf("want a server error, got %v", err)
			}
			return idem.Result{Status: 409}, nil
		}, nil, true, 0},
		{"aborted, 201 answered", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			_, _ = idempg.TxFromContext(ctx).Exec(ctx, `SELECT 1/0`)
			return idem.Result{Status: 201}, nil
		}, idem.ErrWritesAborted, false, 0},
		{"NotExecuted", func(ctx context.Context, ref string) (idem.Result, error) {
			_ = insertOrder(ctx, ref)
			idem.NotExecuted(ctx)
			return idem.Result{Status: 404}, nil
		}, nil, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := "end-" + strings.ReplaceAll(strings.ReplaceAll(c.name, " ", "-"), ",", "")
			op := idem.Operation{Key: key, Fingerprint: []byte("f")}
			_, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) { return c.fn(ctx, key) })
			var pe *idem.PanicError
			switch {
			case c.wantErr == nil && err != nil:
				t.Fatalf("Do = %v, want success", err)
			case errors.As(c.wantErr, &pe):
				if !errors.As(err, &pe) {
					t.Fatalf("Do = %v, want a *idem.PanicError", err)
				}
			case c.wantErr != nil && !errors.Is(err, c.wantErr):
				t.Fatalf("Do = %v, want %v", err, c.wantErr)
			}
			rec, gerr := e.store.Get(ctx, "", key)
			if c.stored != (gerr == nil) {
				t.Errorf("record kept = %v (%v), want %v", gerr == nil, gerr, c.stored)
			}
			if gerr == nil && rec.State != idem.StateComplete {
				t.Errorf("record is %s, want complete", rec.State)
			}
			if got := e.countOrders(t, key); got != c.orders {
				t.Errorf("%d orders, want %d", got, c.orders)
			}
			if n := e.heldLocks(t); n != 0 {
				t.Errorf("%d advisory locks still held by idle pool connections", n)
			}
			// The key is free (or replayed) at once: nothing waits on it.
			op.WaitInFlight = 0
			_, err = eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) { return idem.Result{Status: 200}, nil })
			if errors.Is(err, idem.ErrInFlight) {
				t.Errorf("retry found the key still locked")
			}
		})
	}
}

// TestSingleTransactionHolderKilled: when the holder's session dies (its
// process killed, here its backend terminated), PostgreSQL rolls its
// transaction back and frees the key; the waiting duplicate then runs,
// once.
func TestSingleTransactionHolderKilled(t *testing.T) {
	e, eng := newSingleEnv(t, 8)
	ctx := context.Background()
	op := idem.Operation{Key: "killed", Fingerprint: []byte("f"), WaitInFlight: 30 * time.Second}
	pid := make(chan uint32, 1)
	first := make(chan error, 1)
	dead := make(chan struct{})
	go func() {
		_, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := insertOrder(ctx, "killed"); err != nil {
				return idem.Result{}, err
			}
			pid <- idempg.TxFromContext(ctx).Conn().PgConn().PID()
			<-dead // hangs until its session is gone
			_, err := idempg.TxFromContext(ctx).Exec(ctx, `SELECT 1`)
			return idem.Result{Status: 201, Body: []byte("first")}, err
		})
		first <- err
	}()
	holder := <-pid
	dup := make(chan idem.Outcome, 1)
	dupErr := make(chan error, 1)
	go func() {
		out, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{Status: 201, Body: []byte("second")}, insertOrder(ctx, "killed")
		})
		dup <- out
		dupErr <- err
	}()
	time.Sleep(50 * time.Millisecond) // the duplicate is waiting on the lock
	if _, err := e.peer.Exec(ctx, `SELECT pg_terminate_backend($1)`, holder); err != nil {
		t.Fatalf("terminate the holder: %v", err)
	}
	out, err := <-dup, <-dupErr
	if err != nil || out.Replayed || string(out.Result.Body) != "second" {
		t.Fatalf("duplicate after the holder died = %+v, %v; want its own run", out, err)
	}
	close(dead)
	if err := <-first; err == nil {
		t.Errorf("the killed holder's execution succeeded")
	}
	if got := e.countOrders(t, "killed"); got != 1 {
		t.Errorf("%d orders, want 1 (the dead holder's rolled back)", got)
	}
}

// TestSingleTransactionPairsRunOnce sends many keys twice at one barrier,
// with a handler that returns at once: the duplicate's claim then often
// reads the key just before the first execution commits and asks for the
// lock just after. The handler must still run once per key (an effect it
// had outside the transaction would otherwise happen twice), and both
// requests get the answer.
func TestSingleTransactionPairsRunOnce(t *testing.T) {
	e, eng := newSingleEnv(t, 8)
	const keys = 400
	var runs atomic.Int32
	failures := 0
	for k := range keys {
		op := idem.Operation{Key: fmt.Sprintf("pair-%d", k), Fingerprint: []byte("f"), WaitInFlight: 10 * time.Second}
		errs := make([]error, 2)
		atonce.Run(2, func(i int) {
			_, errs[i] = eng.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
				runs.Add(1)
				return idem.Result{Status: 201}, insertOrder(ctx, op.Key)
			})
		})
		for _, err := range errs {
			if err != nil {
				failures++
				t.Logf("key %d: %v", k, err)
			}
		}
	}
	if n := runs.Load(); n != keys || failures != 0 {
		t.Errorf("the handler ran %d times for %d keys sent twice each, %d requests failed; want %d runs, no failure", n, keys, failures, keys)
	}
	if n := e.heldLocks(t); n != 0 {
		t.Errorf("%d advisory locks still held by idle pool connections", n)
	}
}
