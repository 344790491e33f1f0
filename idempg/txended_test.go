package idempg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestAnswerAfterRollbackClassNotStored: once a real deadlock between two
// transactions (40P01) or a serialization failure (40001) rolled the
// handler's transaction back, nothing it answers is stored: not a 5xx
// (stored without its writes otherwise), not an answer after the Tx's
// Rollback, not a plain error answer. Do reports a store error wrapping
// idempg.ErrTxEnded, the key is released and the retry runs. A helper
// that runs the statement again on a deadlock stops at the first retry.
func TestAnswerAfterRollbackClassNotStored(t *testing.T) {
	e := newEnv(t, 4)
	answerAfterRollbackClassNotStored(t, e, mustEngine(t, e.store))
}

// TestSingleTransactionAnswerAfterRollbackClassNotStored: the same in the
// single-transaction mode, whose Complete stores the answer alone after
// a ROLLBACK of its own: a deadlock must not be answered from there.
func TestSingleTransactionAnswerAfterRollbackClassNotStored(t *testing.T) {
	e, eng := newSingleEnv(t, 4)
	answerAfterRollbackClassNotStored(t, e, eng)
}

func answerAfterRollbackClassNotStored(t *testing.T, e *env, eng *idem.Engine) {
	ctx := context.Background()
	if _, err := e.pool.Exec(ctx, `CREATE TABLE locks (id int PRIMARY KEY, v int NOT NULL);
		INSERT INTO locks VALUES (1, 0), (2, 0)`); err != nil {
		t.Fatal(err)
	}
	endings := []struct {
		name string
		end  func(ctx context.Context, t *testing.T) error
		// again is the statement a retry helper runs again.
		again func(ctx context.Context) error
	}{
		{"deadlock", func(ctx context.Context, t *testing.T) error { return deadlock(ctx, t, e) },
			func(ctx context.Context) error {
				_, err := idempg.TxFromContext(ctx).Exec(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
				return err
			}},
		{"serialization failure", func(ctx context.Context, t *testing.T) error { return serializationFailure(ctx, t, e) },
			func(ctx context.Context) error {
				var v int
				return idempg.TxFromContext(ctx).QueryRow(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1 RETURNING v`).Scan(&v)
			}},
	}
	answers := []struct {
		name   string
		answer func(ctx context.Context, t *testing.T) (idem.Result, error)
	}{
		{"5xx with RollbackWrites", func(ctx context.Context, t *testing.T) (idem.Result, error) {
			idem.RollbackWrites(ctx)
			return idem.Result{Status: 500}, nil
		}},
		{"Rollback then 409", func(ctx context.Context, t *testing.T) (idem.Result, error) {
			if err := idempg.TxFromContext(ctx).Rollback(ctx); !errors.Is(err, idempg.ErrTxEnded) {
				t.Errorf("Rollback after the deadlock = %v, want ErrTxEnded", err)
			}
			return idem.Result{Status: 409}, nil
		}},
		{"plain 500", func(ctx context.Context, t *testing.T) (idem.Result, error) {
			return idem.Result{Status: 500}, nil
		}},
	}
	for _, end := range endings {
		for _, a := range answers {
			t.Run(end.name+"/"+a.name, func(t *testing.T) {
				op := idem.Operation{Tenant: "t", Key: strings.ReplaceAll(end.name+"/"+a.name, " ", "-")}
				ref := op.Key
				_, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
					// The level of a transaction is set before its
					// first query, which takes the snapshot.
					if _, err := idempg.TxFromContext(ctx).Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ`); err != nil {
						return idem.Result{}, err
					}
					if err := insertOrder(ctx, ref); err != nil {
						return idem.Result{}, err
					}
					err, attempts := end.end(ctx, t), 0
					if !rollbackClass(err) {
						t.Fatalf("the statement that met the end = %v, want SQLSTATE class 40", err)
					}
					for rollbackClass(err) && attempts < 1000 {
						attempts++
						err = end.again(ctx)
					}
					if attempts != 1 || !errors.Is(err, idempg.ErrTxEnded) {
						t.Errorf("the retry helper ran %d times and ended with %v; want once, told ErrTxEnded", attempts, err)
					}
					return a.answer(ctx, t)
				})
				if !errors.Is(err, idem.ErrStore) || !errors.Is(err, idempg.ErrTxEnded) || rollbackClass(err) {
					t.Errorf("Do = %v; want a store error wrapping ErrTxEnded, not the retryable error", err)
				}
				if rec, err := e.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
					t.Errorf("Get = %+v, %v; want ErrNotFound (nothing stored, key released)", rec, err)
				}
				ran := false
				out, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
					ran = true
					return idem.Result{Status: 201}, insertOrder(ctx, ref)
				})
				if err != nil || !ran || out.Replayed || out.Result.Status != 201 {
					t.Errorf("retry = %+v, %v, ran %v; want a fresh 201", out, err, ran)
				}
				if n := e.countOrders(t, ref); n != 1 {
					t.Errorf("%d orders, want the retry's alone", n)
				}
			})
		}
	}

	// A deadlock inside a savepoint the handler rolls back to leaves the
	// transaction live: its other writes and its answer commit together.
	t.Run("deadlock undone by a savepoint", func(t *testing.T) {
		op := idem.Operation{Tenant: "t", Key: "savepoint"}
		out, err := eng.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			tx := idempg.TxFromContext(ctx)
			if err := insertOrder(ctx, op.Key); err != nil {
				return idem.Result{}, err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return idem.Result{}, err
			}
			if err := deadlockOn(ctx, t, e, sp); !rollbackClass(err) {
				t.Fatalf("deadlock in the savepoint = %v", err)
			}
			if err := sp.Rollback(ctx); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201}, insertOrder(ctx, op.Key+"-after")
		})
		if err != nil || out.Result.Status != 201 {
			t.Fatalf("Do = %+v, %v; want the 201 stored", out, err)
		}
		if rec, err := e.store.Get(ctx, op.Tenant, op.Key); err != nil || rec.State != idem.StateComplete {
			t.Errorf("Get = %+v, %v; want the record complete", rec, err)
		}
		if a, b := e.countOrders(t, op.Key), e.countOrders(t, op.Key+"-after"); a != 1 || b != 1 {
			t.Errorf("orders %d and %d, want both committed", a, b)
		}
	})
}

// rollbackClass reports a class 40 error: what a "retry on deadlock"
// helper retries.
func rollbackClass(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40P01" || pgErr.Code == "40001")
}

// deadlock makes the handler's transaction the victim of a deadlock with
// a peer transaction, and returns the handler's error.
func deadlock(ctx context.Context, t *testing.T, e *env) error {
	return deadlockOn(ctx, t, e, idempg.TxFromContext(ctx))
}

// deadlockOn is deadlock through tx (the handler's, or a savepoint of it).
// PostgreSQL's victim is the waiter whose deadlock_timeout runs out with
// the cycle closed: the peer's is set past the test, so only the
// handler's (1s) can, and the peer waits first.
func deadlockOn(ctx context.Context, t *testing.T, e *env, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	peer, err := e.peer.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Rollback(ctx) //nolint:errcheck // harmless after Commit
	var pid int
	if _, err := peer.Exec(ctx, `SET LOCAL deadlock_timeout = '10min'`); err != nil {
		t.Fatal(err)
	}
	if err := peer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := peer.Exec(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	peerDone := make(chan error, 1)
	go func() {
		_, err := peer.Exec(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`)
		peerDone <- err
	}()
	for {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	_, handlerErr := tx.Exec(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
	if handlerErr == nil {
		t.Fatalf("the peer was the deadlock's victim: %v", <-peerDone)
	}
	if err := <-peerDone; err != nil {
		t.Fatalf("peer: %v", err)
	}
	if err := peer.Commit(ctx); err != nil {
		t.Fatalf("peer commit: %v", err)
	}
	return handlerErr
}

// serializationFailure has the handler, in REPEATABLE READ (set by its
// first statement, see the test), update a row that another transaction
// changed since its snapshot: 40001, through QueryRow.
func serializationFailure(ctx context.Context, t *testing.T, e *env) error {
	if _, err := e.peer.Exec(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	var v int
	return idempg.TxFromContext(ctx).QueryRow(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1 RETURNING v`).Scan(&v)
}
