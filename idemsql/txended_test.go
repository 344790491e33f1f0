package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
)

// TestAnswerAfterTxEndedNotStored: once the database ended the handler's
// transaction (a real deadlock between two transactions on MariaDB and on
// PostgreSQL, INSERT OR ROLLBACK on SQLite), nothing the handler answers
// is stored: not a 5xx (stored without its writes otherwise), not an
// answer after Tx.Rollback, not a plain error answer. Do reports a store
// error wrapping idemsql.ErrTxEnded, the key is released, and the retry
// runs. A helper that runs the statement again on a deadlock stops at the
// first retry: the statements after the end no longer unwrap to the
// driver's error.
func TestAnswerAfterTxEndedNotStored(t *testing.T) {
	answers := []struct {
		name string
		// answer is what the handler does once its transaction ended.
		answer func(ctx context.Context) (idem.Result, error)
	}{
		{"5xx with RollbackWrites", func(ctx context.Context) (idem.Result, error) {
			// What idemhttp does with a 500: the answer alone, stored.
			idem.RollbackWrites(ctx)
			return idem.Result{Status: 500, Body: []byte("deadlock")}, nil
		}},
		{"Tx.Rollback then 409", func(ctx context.Context) (idem.Result, error) {
			if err := idemsql.TxFromContext(ctx).Rollback(); !errors.Is(err, idemsql.ErrTxEnded) {
				t.Errorf("Tx.Rollback after the end = %v, want ErrTxEnded", err)
			}
			return idem.Result{Status: 409, Body: []byte("conflict")}, nil
		}},
		{"plain 500", func(ctx context.Context) (idem.Result, error) {
			return idem.Result{Status: 500}, nil
		}},
	}
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		for _, q := range []string{
			`CREATE TABLE locks (id INT PRIMARY KEY, v INT NOT NULL)`,
			`INSERT INTO locks (id, v) VALUES (1, 0), (2, 0)`,
			`CREATE TABLE ballast (id INT NOT NULL)`,
		} {
			if _, err := env.db.ExecContext(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		engine := newEngine(t, env.store, nil)
		for _, a := range answers {
			op := idem.Operation{Tenant: newName("tenant"), Key: newName("k")}
			row := newName("row")
			_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				if err := env.businessWrite(ctx, row); err != nil {
					return idem.Result{}, err
				}
				first := endTransaction(ctx, t, env)
				var ended *idemsql.TxEndedError
				if !errors.As(first, &ended) {
					t.Fatalf("%s: the statement that met the end = %v, want a *TxEndedError", a.name, first)
				}
				// The usual helper: run the statement again while the
				// database says deadlock. Bounded here only so that
				// the test ends; it must stop after one retry.
				err, attempts := first, 0
				for retryable(env.dialect, err) && attempts < 1000 {
					attempts++
					_, err = idemsql.TxFromContext(ctx).ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
				}
				if env.dialect != idemsql.SQLite && attempts != 1 {
					t.Errorf("%s: the retry helper ran %d times, want 1 (the first retry is told the transaction is gone)", a.name, attempts)
				}
				later := env.businessWrite(ctx, row)
				if !errors.Is(later, idemsql.ErrTxEnded) || errors.Is(later, ended.Cause) || retryable(env.dialect, later) {
					t.Errorf("%s: a statement after the end = %v; want ErrTxEnded, not unwrapping to %v", a.name, later, ended.Cause)
				}
				return a.answer(ctx)
			})
			if !errors.Is(err, idem.ErrStore) || !errors.Is(err, idemsql.ErrTxEnded) || errors.Is(err, ended(err)) {
				t.Errorf("%s: Do = %v; want a store error wrapping ErrTxEnded (HTTP 503)", a.name, err)
			}
			if rec, err := env.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
				t.Errorf("%s: Get = %+v, %v; want ErrNotFound (nothing stored, key released)", a.name, rec, err)
			}
			mustCount(t, env, row, 0)
			ran := false
			out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
				ran = true
				return idem.Result{Status: 201}, env.businessWrite(ctx, row)
			})
			if err != nil || !ran || out.Replayed || out.Result.Status != 201 {
				t.Errorf("%s: retry = %+v, %v, ran %v; want a fresh 201", a.name, out, err, ran)
			}
			mustCount(t, env, row, 1)
		}
	})
}

// ended returns the cause a *TxEndedError in err's chain carries, or nil.
func ended(err error) error {
	var e *idemsql.TxEndedError
	if errors.As(err, &e) {
		return e.Cause
	}
	return nil
}

// retryable reports what a "retry on deadlock" helper looks for: MySQL's
// 1213, PostgreSQL's 40P01 or 40001.
func retryable(d idemsql.Dialect, err error) bool {
	switch d {
	case idemmysql.Dialect:
		return isDeadlock(err)
	case idemsql.Postgres:
		var e interface{ SQLState() string }
		return errors.As(err, &e) && (e.SQLState() == "40P01" || e.SQLState() == "40001")
	}
	return false
}

// endTransaction makes the database end the handler's transaction, and
// returns the error of the handler's statement that met the end: a
// deadlock with a peer transaction on MySQL and PostgreSQL, the handler
// the victim; INSERT OR ROLLBACK on SQLite, which has no deadlock (the
// handler's transaction holds the write lock from its start).
func endTransaction(ctx context.Context, t *testing.T, env *testDB) error {
	tx := idemsql.TxFromContext(ctx)
	if env.dialect == idemsql.SQLite {
		_, err := tx.ExecContext(ctx, `INSERT OR ROLLBACK INTO locks (id, v) VALUES (1, 0)`)
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	peer, err := env.peerDB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Rollback() //nolint:errcheck // harmless after Commit
	var peerPID int
	if env.dialect == idemmysql.Dialect {
		// InnoDB rolls back the lighter transaction: make the peer the
		// heavier one.
		for i := range 50 {
			if _, err := peer.ExecContext(ctx, `INSERT INTO ballast (id) VALUES (?)`, i); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		// PostgreSQL's victim is the waiter whose deadlock_timeout runs
		// out with the cycle closed: only the handler's may (1s).
		if _, err := peer.ExecContext(ctx, `SET LOCAL deadlock_timeout = '10min'`); err != nil {
			t.Fatal(err)
		}
		if err := peer.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&peerPID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := peer.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`); err != nil {
		t.Fatal(err)
	}
	peerDone := make(chan error, 1)
	go func() {
		_, err := peer.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 1`)
		peerDone <- err
	}()
	if env.dialect == idemsql.Postgres {
		waitBlocked(ctx, t, env.db, peerPID)
	}
	_, handlerErr := tx.ExecContext(ctx, `UPDATE locks SET v = v + 1 WHERE id = 2`)
	if handlerErr == nil {
		t.Fatalf("the peer was the deadlock's victim: %v", <-peerDone)
	}
	if err := <-peerDone; err != nil {
		t.Fatalf("peer: %v", err)
	}
	if err := peer.Commit(); err != nil {
		t.Fatalf("peer commit: %v", err)
	}
	return handlerErr
}

// waitBlocked returns once the session pid waits for a lock (the peer,
// behind the handler's row): then the handler's own wait closes the
// cycle, and its deadlock check finds it.
func waitBlocked(ctx context.Context, t *testing.T, db *sql.DB, pid int) {
	for {
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND NOT granted`, pid).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestMySQLDDLThen5xxNotStored: DDL commits the handler's transaction
// implicitly, with no error to show for it; a 5xx answered after it
// (stored without its writes otherwise) is not stored either: the
// rollback finds the transaction gone, Do reports ErrTxEnded, the key is
// released.
func TestMySQLDDLThen5xxNotStored(t *testing.T) {
	s := newMySQLShop(t, nil)
	ctx := context.Background()
	op := idem.Operation{Tenant: newName("tenant"), Key: "ddl-5xx"}
	_, err := s.engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
		if err := s.insertOrder(ctx, op.Key, "first"); err != nil {
			return idem.Result{}, err
		}
		if _, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `CREATE TABLE IF NOT EXISTS orders (order_key VARCHAR(255))`); err != nil {
			return idem.Result{}, err
		}
		idem.RollbackWrites(ctx)
		return idem.Result{Status: 503}, nil
	})
	if !errors.Is(err, idem.ErrStore) || !errors.Is(err, idemsql.ErrTxEnded) {
		t.Errorf("Do = %v, want a store error wrapping ErrTxEnded", err)
	}
	if rec, err := s.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get = %+v, %v; want ErrNotFound (nothing stored, key released)", rec, err)
	}
}
