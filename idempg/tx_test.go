package idempg_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
)

func TestTxOutsideIdemIsNil(t *testing.T) {
	if tx := idempg.Tx(context.Background()); tx != nil {
		t.Fatalf("Tx outside idem = %v, want nil", tx)
	}
}

// TestHandlerTxRefusesToEnd checks that the handler cannot commit or roll
// back idem's transaction, may use savepoints, and cannot use the
// transaction once idem has ended it (its connection is back in the pool).
func TestHandlerTxRefusesToEnd(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	var leaked pgx.Tx
	out, err := mustEngine(t, e.store).Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		tx := idempg.Tx(ctx)
		leaked = tx
		if err := tx.Commit(ctx); !errors.Is(err, idempg.ErrTxOwned) {
			return idem.Result{}, errors.New("Commit did not refuse")
		}
		if err := tx.Rollback(ctx); !errors.Is(err, idempg.ErrTxOwned) {
			return idem.Result{}, errors.New("Rollback did not refuse")
		}
		// A savepoint the handler rolls back itself: its write goes, the
		// write before it stays.
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
		return idem.Result{Status: 201}, nil
	})
	if err != nil || out.Result.Status != 201 {
		t.Fatalf("Do: %+v, %v", out, err)
	}
	if e.countOrders(t, "kept") != 1 || e.countOrders(t, "undone") != 0 {
		t.Fatal("savepoint: want the write before it kept and the one inside it undone")
	}
	if _, err := leaked.Exec(ctx, `SELECT 1`); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec on the ended transaction: %v, want pgx.ErrTxClosed", err)
	}
	if err := leaked.QueryRow(ctx, `SELECT 1`).Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("QueryRow on the ended transaction: %v, want pgx.ErrTxClosed", err)
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
		err := idempg.Tx(ctx).QueryRow(ctx, `SHOW synchronous_commit`).Scan(&inHandler)
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
