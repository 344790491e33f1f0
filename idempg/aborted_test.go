package idempg_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestAnswerAfterSQLErrorIsStored: a sign-up handler calls a CRM (an
// effect outside the database), writes an audit row, then inserts an
// account that exists: the unique violation aborts its transaction, and
// the handler answers 409 "account exists". That answer is stored, its
// writes rolled back, and replayed: eight duplicates at the same instant
// and three retries after them run the handler once, and call the CRM
// once.
func TestAnswerAfterSQLErrorIsStored(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE accounts (email text PRIMARY KEY);
		INSERT INTO accounts VALUES ('ada@example.com')`); err != nil {
		t.Fatal(err)
	}
	eng := mustEngine(t, e.store)
	var runs, crmCalls atomic.Int32
	signUp := func(ctx context.Context) (idem.Result, error) {
		runs.Add(1)
		crmCalls.Add(1)
		if err := insertOrder(ctx, "audit"); err != nil {
			return idem.Result{}, err
		}
		_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO accounts (email) VALUES ($1)`, "ada@example.com")
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			return idem.Result{Status: 409, Body: []byte("account exists")}, nil
		}
		if err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, nil
	}
	op := idem.Operation{Tenant: "t", Key: "signup-1", Fingerprint: []byte("fp")}
	check := func(what string, out idem.Outcome, err error) {
		t.Helper()
		if errors.Is(err, idem.ErrInFlight) {
			return
		}
		if err != nil || out.Result.Status != 409 || string(out.Result.Body) != "account exists" {
			t.Fatalf("%s: %+v, %v; want the 409 (or in flight)", what, out, err)
		}
	}
	const burst = 8
	outs := make([]idem.Outcome, burst)
	errs := make([]error, burst)
	atOnce(burst, func(i int) { outs[i], errs[i] = eng.Do(ctx, op, signUp) })
	for i := range outs {
		check("duplicate", outs[i], errs[i])
	}
	for i := range 3 {
		out, err := eng.Do(ctx, op, signUp)
		check("retry", out, err)
		if !out.Replayed {
			t.Fatalf("retry %d after the burst ran again: %+v, %v", i, out, err)
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times (the CRM was called %d times), want once", n, crmCalls.Load())
	}
	if n := e.countOrders(t, "audit"); n != 0 {
		t.Fatalf("%d audit rows committed from the aborted transaction, want 0", n)
	}
	rec, err := e.store.Get(ctx, "t", "signup-1")
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 409 {
		t.Fatalf("record: %+v, %v; want complete with the 409", rec, err)
	}
}

// failures are the ways a statement may abort the handler's transaction.
// Each first writes an order tagged ref (except where the failing
// statement is the first one), then fails, and returns the failure.
var failures = map[string]func(ctx context.Context, ref string) error{
	"FirstStatement": func(ctx context.Context, ref string) error {
		// The failing statement carries the BEGIN.
		_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO no_such_table VALUES ($1)`, ref)
		return err
	},
	"LaterStatement": func(ctx context.Context, ref string) error {
		if err := insertOrder(ctx, ref); err != nil {
			return err
		}
		_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (id, ref) VALUES (1, $1), (1, $1)`, ref)
		return err
	},
	"QueryRow": func(ctx context.Context, ref string) error {
		if err := insertOrder(ctx, ref); err != nil {
			return err
		}
		var n int
		return idempg.TxFromContext(ctx).QueryRow(ctx, `SELECT 1 / (count(*) - count(*)) FROM orders WHERE ref = $1`, ref).Scan(&n)
	},
	"Batch": func(ctx context.Context, ref string) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders (ref) VALUES ($1)`, ref)
		b.Queue(`INSERT INTO orders (ref) VALUES (NULL)`)
		return idempg.TxFromContext(ctx).SendBatch(ctx, b).Close()
	},
	"SavepointReleased": func(ctx context.Context, ref string) error {
		// A failure inside a savepoint that the handler does not roll
		// back to: the whole transaction stays aborted.
		if err := insertOrder(ctx, ref); err != nil {
			return err
		}
		sp, err := idempg.TxFromContext(ctx).Begin(ctx)
		if err != nil {
			return err
		}
		_, err = sp.Exec(ctx, `INSERT INTO orders (ref) VALUES (NULL)`)
		if cerr := sp.Commit(ctx); err == nil {
			err = cerr
		}
		return err
	},
}

// TestAbortedTransactionStoresAnswerAlone: whatever statement aborted the
// transaction, Complete rolls it back, every write included, and stores
// the answer with a fenced statement of its own; the connection goes back
// to the pool idle, and is reused.
func TestAbortedTransactionStoresAnswerAlone(t *testing.T) {
	e := newEnv(t, 1) // one connection: the one that completes is the one reused
	ctx := context.Background()
	for name, fail := range failures {
		t.Run(name, func(t *testing.T) {
			ref := "aborted-" + name
			if res, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: ref, Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil || !res.Won {
				t.Fatalf("claim: %+v, %v", res, err)
			}
			unit, err := e.store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer unit.Rollback(ctx)
			if err := fail(unit.Context(ctx), ref); err == nil {
				t.Fatal("the failing statement succeeded")
			}
			want := idem.Result{Status: 409, Body: []byte("conflict: " + name)}
			if err := unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: ref, Token: 1, Result: want}); err != nil {
				t.Fatalf("complete after the failed statement: %v, want the answer stored", err)
			}
			rec, err := e.store.Get(ctx, "t", ref)
			if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 409 || string(rec.Result.Body) != string(want.Body) {
				t.Fatalf("record: %+v, %v", rec, err)
			}
			if n := e.countOrders(t, ref); n != 0 {
				t.Fatalf("%d rows of the aborted transaction committed, want 0", n)
			}
			checkPoolReused(t, e)
		})
	}
}

// checkPoolReused checks that e.pool (of one connection) made one
// connection only, holds none, and that the connection is idle.
func checkPoolReused(t *testing.T, e *env) {
	t.Helper()
	if st := e.pool.Stat(); st.AcquiredConns() != 0 || st.NewConnsCount() != 1 {
		t.Fatalf("pool: %d acquired, %d connections made; want 0 and 1 (reused, not destroyed)", st.AcquiredConns(), st.NewConnsCount())
	}
	conn, err := e.pool.Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		t.Fatalf("the connection came back with transaction status %q, want idle", st)
	}
}

// TestAbortedTransactionLeaseLost: the answer after a failed statement is
// fenced like any other: with the lease taken over, Complete returns
// idem.ErrLeaseLost and the new holder's record is untouched.
func TestAbortedTransactionLeaseLost(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	claim := idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Millisecond, Retention: time.Hour}
	if res, err := e.store.Claim(ctx, claim); err != nil || !res.Won {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	unit, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unit.Rollback(ctx)
	if err := failures["LaterStatement"](unit.Context(ctx), "stale"); err == nil {
		t.Fatal("the failing statement succeeded")
	}
	time.Sleep(5 * time.Millisecond)
	claim.Token, claim.Lease = 2, time.Hour
	if res, err := e.other.Claim(ctx, claim); err != nil || !res.Won {
		t.Fatalf("takeover: %+v, %v", res, err)
	}
	err = unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 409}})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with the stale token: %v, want ErrLeaseLost", err)
	}
	rec, err := e.store.Get(ctx, "t", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.LeaseToken != 2 {
		t.Fatalf("record: %+v, %v; want the new holder's, in flight", rec, err)
	}
	if n := e.countOrders(t, "stale"); n != 0 {
		t.Fatalf("%d rows committed", n)
	}
	checkPoolReused(t, e)
}

// TestSavepointRecoversTransaction: a handler that catches a failed
// statement inside a savepoint and rolls back to it has a live
// transaction again: its other writes commit with its answer, as usual.
func TestSavepointRecoversTransaction(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	out, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		tx := idempg.TxFromContext(ctx)
		if err := insertOrder(ctx, "before"); err != nil {
			return idem.Result{}, err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return idem.Result{}, err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO orders (ref) VALUES (NULL)`); err == nil {
			return idem.Result{}, errors.New("the NULL insert succeeded")
		}
		if err := sp.Rollback(ctx); err != nil {
			return idem.Result{}, err
		}
		if err := insertOrder(ctx, "after"); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, nil
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("Do: %+v, %v", out, err)
	}
	if e.countOrders(t, "before") != 1 || e.countOrders(t, "after") != 1 {
		t.Fatal("the writes around the savepoint rolled back to did not commit with the answer")
	}
}

// TestTransactionEndedThroughConn: a handler that ends the transaction
// itself, by sending COMMIT or ROLLBACK through Conn, leaves idem unable
// to tell what committed: Complete stores nothing and fails, and the
// connection goes back to the pool idle.
func TestTransactionEndedThroughConn(t *testing.T) {
	for _, end := range []string{"COMMIT", "ROLLBACK"} {
		t.Run(end, func(t *testing.T) {
			e := newEnv(t, 1)
			ctx := context.Background()
			if res, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil || !res.Won {
				t.Fatalf("claim: %+v, %v", res, err)
			}
			unit, err := e.store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer unit.Rollback(ctx)
			hctx := unit.Context(ctx)
			if err := insertOrder(hctx, "by-hand"); err != nil {
				t.Fatal(err)
			}
			if _, err := idempg.TxFromContext(hctx).Conn().Exec(ctx, end); err != nil {
				t.Fatal(err)
			}
			err = unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}})
			if !errors.Is(err, pgx.ErrTxClosed) {
				t.Fatalf("complete after %s through Conn: %v, want an error wrapping pgx.ErrTxClosed", end, err)
			}
			rec, err := e.store.Get(ctx, "t", "k")
			if err != nil || rec.State != idem.StateInFlight {
				t.Fatalf("record: %+v, %v; want in flight, nothing stored", rec, err)
			}
			checkPoolReused(t, e)
		})
	}
}

// TestConnectionLostUnderHandler: the server ends the handler's session
// while it is idle in its transaction (as idle_in_transaction_session_timeout
// does), and the handler, which sends nothing more, answers 201. The
// writes are gone with the session, so that answer is not stored:
// Complete fails, and the record stays in flight for the engine to
// release.
func TestConnectionLostUnderHandler(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	if res, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil || !res.Won {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	unit, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unit.Rollback(ctx)
	hctx := unit.Context(ctx)
	var pid int32
	if err := idempg.TxFromContext(hctx).QueryRow(hctx, `INSERT INTO orders (ref) VALUES ($1) RETURNING pg_backend_pid()`, "lost").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	var killed bool
	if err := e.peer.QueryRow(ctx, `SELECT pg_terminate_backend($1, 10000)`, pid).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the handler's backend: %v, %v", killed, err)
	}
	// The client notices a terminated session only when it reads from it.
	err = unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}})
	if err == nil {
		t.Fatal("complete after the session was terminated succeeded: a success stored without its writes")
	}
	rec, gerr := e.store.Get(ctx, "t", "k")
	if gerr != nil || rec.State != idem.StateInFlight {
		t.Fatalf("record: %+v, %v; want in flight, nothing stored (complete said %v)", rec, gerr, err)
	}
	if n := e.countOrders(t, "lost"); n != 0 {
		t.Fatalf("%d rows committed", n)
	}
}

// TestDeferredConstraintRefusesCommit: a constraint checked at COMMIT
// (DEFERRABLE INITIALLY DEFERRED) refuses the commit after the handler
// answered: its writes are rolled back, so its answer, a success, is not
// stored; Complete returns the server's error and the record stays in
// flight for the engine to release. A handler that must know before it
// answers runs SET CONSTRAINTS ALL IMMEDIATE.
func TestDeferredConstraintRefusesCommit(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE seats (seat int, CONSTRAINT one_per_seat UNIQUE (seat) DEFERRABLE INITIALLY DEFERRED)`); err != nil {
		t.Fatal(err)
	}
	if res, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil || !res.Won {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	unit, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer unit.Rollback(ctx)
	hctx := unit.Context(ctx)
	if err := insertOrder(hctx, "booked"); err != nil {
		t.Fatal(err)
	}
	if _, err := idempg.TxFromContext(hctx).Exec(hctx, `INSERT INTO seats VALUES ($1), ($1)`, 7); err != nil {
		t.Fatalf("the deferred check ran early: %v", err)
	}
	err = unit.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
		t.Fatalf("complete: %v, want the unique violation raised at COMMIT", err)
	}
	if rec, err := e.store.Get(ctx, "t", "k"); err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("record: %+v, %v; want in flight, nothing stored", rec, err)
	}
	if n := e.countOrders(t, "booked"); n != 0 {
		t.Fatalf("%d rows committed", n)
	}
	checkPoolReused(t, e)
}

// TestSuccessAfterAbortNotStored: a handler that swallows a failed
// statement and answers a success would have a result stored whose writes
// the abort undid. Do returns idem.ErrWritesAborted instead, stores
// nothing, releases the key, and the connection goes back idle; a 4xx
// answered the same way is stored (TestAbortedTransactionStoresAnswerAlone).
func TestSuccessAfterAbortNotStored(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	engine := mustEngine(t, e.store)
	runs := 0
	handler := func(ctx context.Context) (idem.Result, error) {
		runs++
		if err := insertOrder(ctx, "swallowed"); err != nil {
			return idem.Result{}, err
		}
		_, _ = idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (ref) VALUES (NULL)`) // error swallowed
		return idem.Result{Status: 201}, nil
	}
	for i := range 2 {
		if _, err := engine.Do(ctx, idem.Operation{Tenant: "t", Key: "swallowed"}, handler); !errors.Is(err, idem.ErrWritesAborted) {
			t.Fatalf("Do %d: %v, want idem.ErrWritesAborted", i, err)
		}
	}
	if runs != 2 {
		t.Fatalf("the handler ran %d times, want 2 (the key released after each refusal)", runs)
	}
	if _, err := e.store.Get(ctx, "t", "swallowed"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("record: %v, want none", err)
	}
	if n := e.countOrders(t, "swallowed"); n != 0 {
		t.Fatalf("%d orders committed, want 0", n)
	}
	checkPoolReused(t, e)
}
