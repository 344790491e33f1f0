package idempg_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
)

func TestTxOutsideIdemIsNil(t *testing.T) {
	if tx := idempg.TxFromContext(context.Background()); tx != nil {
		t.Fatalf("TxFromContext outside idem = %v, want nil", tx)
	}
}

// TestDBChoosesTheTransaction: DB gives the handler its transaction
// inside an execution (a write through it rolls back with a failed
// handler), and the pool outside one (the same write commits at once).
func TestDBChoosesTheTransaction(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	if db := idempg.DB(ctx, e.pool); db != idempg.DBTX(e.pool) {
		t.Fatalf("DB outside idem = %T, want the pool", db)
	}
	if _, err := idempg.DB(ctx, e.pool).Exec(ctx, `INSERT INTO orders (ref) VALUES ('outside')`); err != nil || e.countOrders(t, "outside") != 1 {
		t.Fatalf("write through DB outside idem: %v, %d rows", err, e.countOrders(t, "outside"))
	}
	_, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		if _, err := idempg.DB(ctx, e.pool).Exec(ctx, `INSERT INTO orders (ref) VALUES ('inside')`); err != nil {
			return idem.Result{}, err
		}
		if idempg.DB(ctx, e.pool) != idempg.DBTX(idempg.TxFromContext(ctx)) {
			return idem.Result{}, errors.New("DB inside idem is not TxFromContext")
		}
		return idem.Result{}, errors.New("failed after the write")
	})
	if err == nil || err.Error() != "failed after the write" {
		t.Fatalf("Do: %v", err)
	}
	if n := e.countOrders(t, "inside"); n != 0 {
		t.Fatalf("%d rows written through DB survived the failed handler: DB did not use its transaction", n)
	}
}

// TestHandlerCommitIsRefused: Commit refuses with an error that says what
// a handler can do instead, and changes nothing: the write commits with
// the answer when the handler returns.
func TestHandlerCommitIsRefused(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	var commitErr error
	out, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		if err := insertOrder(ctx, "kept"); err != nil {
			return idem.Result{}, err
		}
		commitErr = idempg.TxFromContext(ctx).Commit(ctx)
		if err := insertOrder(ctx, "after"); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, nil
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("Do: %+v, %v", out, err)
	}
	if !errors.Is(commitErr, idempg.ErrTxOwned) {
		t.Fatalf("Commit = %v, want ErrTxOwned", commitErr)
	}
	for _, says := range []string{"return normally", "Rollback", "idem.RollbackWrites(ctx)", "idem.NotExecuted(ctx)"} {
		if !strings.Contains(commitErr.Error(), says) {
			t.Errorf("Commit's error does not name %q: %v", says, commitErr)
		}
	}
	if e.countOrders(t, "kept") != 1 || e.countOrders(t, "after") != 1 {
		t.Fatal("the writes around the refused Commit did not commit with the answer")
	}
}

// TestHandlerRollback: a handler that rolls back its transaction and
// answers 402 has its writes undone at once (another connection sees no
// row, and the pool has its connection back, before the handler
// returns), later statements on the Tx fail with pgx.ErrTxClosed, and
// its answer is stored and replayed: retries sent at the same instant
// run nothing.
func TestHandlerRollback(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()
	eng := mustEngine(t, e.store)
	var runs atomic.Int32
	var during struct {
		rollbackErr, after, again error
		seen                      int
		acquired                  int32
	}
	pay := func(ctx context.Context) (idem.Result, error) {
		if runs.Add(1) > 1 {
			// A retry that ran again; its caller reports it.
			return idem.Result{Status: 402, Body: []byte("card declined")}, nil
		}
		tx := idempg.TxFromContext(ctx)
		if err := insertOrder(ctx, "refused"); err != nil {
			return idem.Result{}, err
		}
		during.rollbackErr = tx.Rollback(ctx) // the card network said no
		during.seen = e.countOrders(t, "refused")
		during.acquired = e.pool.Stat().AcquiredConns()
		_, during.after = tx.Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, "after-rollback")
		during.again = tx.Rollback(ctx)
		return idem.Result{Status: 402, Body: []byte("card declined")}, nil
	}
	op := idem.Operation{Tenant: "t", Key: "pay-1", Fingerprint: []byte("fp")}
	out, err := eng.Do(ctx, op, pay)
	if err != nil || out.Result.Status != 402 || out.Replayed {
		t.Fatalf("Do: %+v, %v", out, err)
	}
	if during.rollbackErr != nil {
		t.Fatalf("Rollback: %v", during.rollbackErr)
	}
	if during.seen != 0 {
		t.Fatalf("%d rows visible after the handler's Rollback, before it returned: want them undone at once", during.seen)
	}
	if during.acquired != 0 {
		t.Fatalf("%d pool connections held after the handler's Rollback, want 0", during.acquired)
	}
	if !errors.Is(during.after, pgx.ErrTxClosed) || !errors.Is(during.again, pgx.ErrTxClosed) {
		t.Fatalf("Exec after Rollback: %v; Rollback again: %v; want pgx.ErrTxClosed", during.after, during.again)
	}
	if n := e.countOrders(t, "refused") + e.countOrders(t, "after-rollback"); n != 0 {
		t.Fatalf("%d rows committed after the handler rolled back", n)
	}
	rec, err := e.store.Get(ctx, "t", "pay-1")
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 402 || string(rec.Result.Body) != "card declined" {
		t.Fatalf("record: %+v, %v; want complete with the 402", rec, err)
	}
	outs := make([]idem.Outcome, 8)
	errs := make([]error, 8)
	atOnce(8, func(i int) { outs[i], errs[i] = eng.Do(ctx, op, pay) })
	for i := range outs {
		if errs[i] != nil || !outs[i].Replayed || outs[i].Result.Status != 402 {
			t.Fatalf("retry %d: %+v, %v; want the 402 replayed", i, outs[i], errs[i])
		}
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
}

// TestHandlerRollbackBeforeAnyQuery: a Rollback before the first query
// has nothing to undo, takes no connection, and the answer is stored.
func TestHandlerRollbackBeforeAnyQuery(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	var execErr error
	out, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		if err := idempg.TxFromContext(ctx).Rollback(ctx); err != nil {
			return idem.Result{}, err
		}
		_, execErr = idempg.DB(ctx, e.pool).Exec(ctx, `INSERT INTO orders (ref) VALUES ('x')`)
		return idem.Result{Status: 422}, nil
	})
	if err != nil || out.Result.Status != 422 {
		t.Fatalf("Do: %+v, %v", out, err)
	}
	if !errors.Is(execErr, pgx.ErrTxClosed) {
		t.Fatalf("write through DB after Rollback: %v, want pgx.ErrTxClosed", execErr)
	}
	if rec, err := e.store.Get(ctx, "t", "k"); err != nil || rec.State != idem.StateComplete || rec.Result.Status != 422 {
		t.Fatalf("record: %+v, %v", rec, err)
	}
}

// TestHandlerTxEndsWithTheExecution: savepoints work inside the handler
// (one rolled back undoes only its own writes), and neither the Tx nor a
// savepoint can be used once the execution has ended, since their
// connection is back in the pool.
func TestHandlerTxEndsWithTheExecution(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	var leaked, leakedSavepoint pgx.Tx
	out, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		tx := idempg.TxFromContext(ctx)
		leaked = tx
		if err := insertOrder(ctx, "kept"); err != nil {
			return idem.Result{}, err
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			return idem.Result{}, err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO orders (ref) VALUES ('undone')`); err != nil {
			return idem.Result{}, err
		}
		if err := sp.Rollback(ctx); err != nil {
			return idem.Result{}, err
		}
		if leakedSavepoint, err = tx.Begin(ctx); err != nil {
			return idem.Result{}, err
		}
		if _, err := leakedSavepoint.Exec(ctx, `INSERT INTO orders (ref) VALUES ('in-savepoint')`); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201}, nil
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("Do: %+v, %v", out, err)
	}
	if e.countOrders(t, "kept") != 1 || e.countOrders(t, "undone") != 0 || e.countOrders(t, "in-savepoint") != 1 {
		t.Fatal("savepoints: want the write before them and the one in the open savepoint kept, the one rolled back undone")
	}
	if _, err := leaked.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec on the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
	if err := leaked.QueryRow(ctx, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("QueryRow on the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
	rows, _ := leaked.Query(ctx, `SELECT 1`) // pgx's manner: the error rides on the rows
	if _, err := pgx.CollectRows(rows, pgx.RowTo[int]); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("rows of Query on the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
	if _, err := leakedSavepoint.Exec(ctx, `INSERT INTO orders (ref) VALUES ('after-end')`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec on a savepoint of the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
	if err := leakedSavepoint.Commit(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Commit of a savepoint of the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
	if n := e.countOrders(t, "after-end"); n != 0 {
		t.Fatalf("a savepoint kept past the handler wrote %d rows outside any execution", n)
	}
	if err := leaked.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Rollback of the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
}

// TestFencingRollsBackBusinessWrite: an execution whose lease was taken
// over writes, then completes with its stale token: ErrLeaseLost, and its
// business write is rolled back in the same round trip. The connection
// goes back to the pool idle, not destroyed.
func TestFencingRollsBackBusinessWrite(t *testing.T) {
	e := newEnv(t, 1) // one connection: the one that completes is the one reused
	ctx := context.Background()
	claim := idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), Token: 1, Lease: time.Millisecond, Retention: time.Hour}
	if res, err := e.store.Claim(ctx, claim); err != nil || !res.Won {
		t.Fatalf("claim: %+v, %v", res, err)
	}
	tx, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := insertOrder(tx.Context(ctx), "stale"); err != nil {
		t.Fatal(err)
	}

	time.Sleep(10 * time.Millisecond)
	claim.Token, claim.Lease = 2, time.Hour
	if res, err := e.other.Claim(ctx, claim); err != nil || !res.Won {
		t.Fatalf("takeover: %+v, %v", res, err)
	}

	err = tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with the stale token: %v, want ErrLeaseLost", err)
	}
	if n := e.countOrders(t, "stale"); n != 0 {
		t.Fatalf("%d business rows survived the lost lease, want 0", n)
	}
	rec, err := e.store.Get(ctx, "t", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.LeaseToken != 2 {
		t.Fatalf("record after the refused completion: %+v, %v", rec, err)
	}
	if st := e.pool.Stat(); st.AcquiredConns() != 0 || st.NewConnsCount() != 1 {
		t.Fatalf("pool after the refused completion: %d acquired, %d connections made; want 0 and 1 (reused, not destroyed)",
			st.AcquiredConns(), st.NewConnsCount())
	}
	// The reused connection is idle, outside any transaction, and works.
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		t.Fatalf("the connection came back with transaction status %q, want idle", st)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatalf("the reused connection fails: %v", err)
	}
}

// TestCompleteStoresResult: a completion commits the business write and
// the result together; Get and a replay claim return the result as given.
func TestCompleteStoresResult(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	if _, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte{0, 1, 2}, Token: 9, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tx, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := insertOrder(tx.Context(ctx), "ok"); err != nil {
		t.Fatal(err)
	}
	want := idem.Result{
		Mode:      idem.ModeReference,
		Status:    201,
		Header:    map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:      []byte{0, 0xff, '\\', 'x', 0},
		Reference: "ord_1",
	}
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 9, Result: want}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatalf("Rollback after Complete: %v, want harmless", err)
	}
	if e.countOrders(t, "ok") != 1 {
		t.Fatal("business write not committed")
	}
	res, err := e.other.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte{0, 1, 2}, Token: 10, Lease: time.Minute, Retention: time.Hour})
	if err != nil || res.Won {
		t.Fatalf("replay claim: %+v, %v", res, err)
	}
	got := res.Record
	if got.State != idem.StateComplete || got.CompletedAt.IsZero() || got.Result.Mode != want.Mode || got.Result.Status != want.Status ||
		string(got.Result.Body) != string(want.Body) || got.Result.Reference != want.Reference ||
		got.Result.Header["Location"][0] != "/orders/1" || len(got.Result.Header) != 2 {
		t.Fatalf("stored record %+v, want result %+v", got, want)
	}
}

// TestBusinessTxSynchronousCommit: the claim turns synchronous_commit off
// for its own statement only; the business transaction, on the very same
// connection, still commits synchronously.
func TestBusinessTxSynchronousCommit(t *testing.T) {
	e := newEnv(t, 1) // the claim and the business transaction share the connection
	ctx := context.Background()
	var inHandler string
	_, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		err := idempg.TxFromContext(ctx).QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inHandler)
		return idem.Result{Status: 200}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if inHandler != "on" {
		t.Fatalf("synchronous_commit in the business transaction = %q, want on", inHandler)
	}
	var after string
	if err := e.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&after); err != nil || after != "on" {
		t.Fatalf("synchronous_commit on the connection after the claim = %q (%v), want on", after, err)
	}
}

// TestCompleteTxInCallersTransaction: the OpTx form completes inside a
// transaction the caller owns and commits.
func TestCompleteTxInCallersTransaction(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	for _, key := range []string{"a", "b"} {
		if _, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: key, Token: 5, Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}

	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO orders (ref) VALUES ('a')`); err != nil {
		t.Fatal(err)
	}
	if err := e.store.CompleteTx(ctx, tx, idem.CompleteParams{Tenant: "t", Key: "a", Token: 5, Result: idem.Result{Status: 204}}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := e.store.Get(ctx, "t", "a")
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 204 || e.countOrders(t, "a") != 1 {
		t.Fatalf("after CompleteTx and commit: %+v, %v", rec, err)
	}

	tx, err = e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (ref) VALUES ('b')`); err != nil {
		t.Fatal(err)
	}
	err = e.store.CompleteTx(ctx, tx, idem.CompleteParams{Tenant: "t", Key: "b", Token: 6})
	if !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("CompleteTx with another token: %v, want ErrLeaseLost", err)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit of the aborted transaction succeeded")
	}
	if e.countOrders(t, "b") != 0 {
		t.Fatal("business write committed despite the lost lease")
	}
}
