package idemsql_test

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
	"github.com/idem-go/idem/internal/testenv"
)

func newEngine(t testing.TB, st idem.Store, cfg *idem.Config) *idem.Engine {
	t.Helper()
	if cfg == nil {
		cfg = &idem.Config{Heartbeat: -1}
	}
	if cfg.Logger == nil {
		// The engine warns of every execution rolled back, which many
		// of these tests cause on purpose.
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e, err := idem.NewEngine(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

// TestTxFromContext: outside an execution there is no Tx, and DB gives
// the *sql.DB; inside, both give the execution's Tx.
func TestTxFromContext(t *testing.T) {
	env := newTestDB(t, idemsql.SQLite)
	ctx := context.Background()
	if tx := idemsql.TxFromContext(ctx); tx != nil {
		t.Fatalf("TxFromContext outside an execution = %v, want nil", tx)
	}
	if db := idemsql.DB(ctx, env.db); db != idemsql.DBTX(env.db) {
		t.Fatalf("DB outside an execution = %v, want the *sql.DB", db)
	}
	engine := newEngine(t, env.store, nil)
	_, err := engine.Do(ctx, idem.Operation{Tenant: newName("tenant"), Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		tx := idemsql.TxFromContext(ctx)
		if tx == nil || idemsql.DB(ctx, env.db) != idemsql.DBTX(tx) {
			t.Errorf("inside: TxFromContext %v, DB %v", tx, idemsql.DB(ctx, env.db))
		}
		return idem.Result{Status: 200}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestTransactionBeginsAtFirstStatement: the handler's transaction, and
// its connection, are taken at its first statement: a handler busy with
// something else first holds no connection, and one that makes no
// statement costs a single statement after the read and the claim, the
// fenced completion, with no transaction around it.
func TestTransactionBeginsAtFirstStatement(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		db, log := openLogged(t, env)
		engine := newEngine(t, testenv.Must(idemsql.NewStore(db, env.dialect)), nil)
		tenant := newName("tenant")
		do := func(key string, fn func(ctx context.Context) (idem.Result, error)) {
			t.Helper()
			if _, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: key}, fn); err != nil {
				t.Fatalf("Do(%s): %v", key, err)
			}
		}
		noop := func(context.Context) (idem.Result, error) { return idem.Result{Status: 200}, nil }
		do("warm-up", noop) // the Store's one-time reads (SQLite: busy_timeout)
		log.take()

		// On SQLite the claim of a new key commits without waiting for the
		// disk, for that statement only.
		claim := []string{"peek", "claim"}
		mariaDB := isMariaDB(t, env)
		switch {
		case env.dialect == idemsql.SQLite:
			claim = []string{"peek", "PRAGMA synchronous = NORMAL", "claim", "PRAGMA synchronous = 2"}
		case mariaDB:
			claim = []string{"peek and claim"}
		}
		do("unused", noop)
		if got := kinds(log.take()); !slices.Equal(got, append(slices.Clone(claim), "complete")) {
			t.Errorf("an execution that made no statement sent %q, want the read before the claim, the claim and the completion alone", got)
		}

		entered, proceed := make(chan struct{}), make(chan struct{})
		done := make(chan struct{})
		business := newName("order")
		go func() {
			defer close(done)
			do("slow", func(ctx context.Context) (idem.Result, error) {
				close(entered)
				<-proceed // a call to another service
				return idem.Result{Status: 201}, env.businessWriteOn(ctx, business)
			})
		}()
		<-entered
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("%d connections in use while the handler has made no statement, want 0", n)
		}
		if got := kinds(log.take()); !slices.Equal(got, claim) {
			t.Errorf("before the handler's first statement: %q, want the read before the claim and the claim alone", got)
		}
		close(proceed)
		<-done
		want := map[idemsql.Dialect][]string{
			idemsql.SQLite: {"begin", "INSERT INTO business", "release and complete", "COMMIT"},
			idemmysql.Dialect: {"SET autocommit =", "SAVEPOINT idem_unit", "INSERT INTO business",
				"RELEASE SAVEPOINT idem_unit", "complete", "SET autocommit ="},
			idemsql.Postgres: {"BEGIN; SET LOCAL", "INSERT INTO business", "complete", "COMMIT"},
		}[env.dialect]
		if mariaDB {
			want = []string{"begin", "INSERT INTO business", "complete and commit"}
		}
		if got := kinds(log.take()); !slices.Equal(got, want) {
			t.Errorf("from the handler's first statement on: %q, want %q", got, want)
		}
		mustCount(t, env, business, 1)
	})
}

// businessWriteOn inserts a business row through DB(ctx, env.db): the
// handler's transaction inside an execution.
func (e *testDB) businessWriteOn(ctx context.Context, id string) error {
	_, err := idemsql.DB(ctx, e.db).ExecContext(ctx, `INSERT INTO business (id) VALUES (`+e.placeholder()+`)`, id)
	return err
}

// TestHandlerRollback: a handler that calls Rollback has its writes undone
// at once, and its answer stored and replayed without them; statements
// after the Rollback fail with ErrTxRolledBack, on every path of Tx.
func TestHandlerRollback(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		engine := newEngine(t, env.store, nil)
		for _, wrote := range []bool{true, false} {
			op := idem.Operation{Tenant: newName("tenant"), Key: "pay-1"}
			business, after := newName("order"), newName("after")
			runs := 0
			handler := func(ctx context.Context) (idem.Result, error) {
				runs++
				tx := idemsql.TxFromContext(ctx)
				if wrote {
					if err := env.businessWrite(ctx, business); err != nil {
						return idem.Result{}, err
					}
				}
				if err := tx.Rollback(); err != nil {
					t.Errorf("Rollback: %v", err)
				}
				if wrote {
					// Undone now, not at the handler's return.
					mustCount(t, env, business, 0)
				}
				if err := env.businessWrite(ctx, after); !errors.Is(err, idemsql.ErrTxRolledBack) {
					t.Errorf("ExecContext after Rollback = %v, want ErrTxRolledBack", err)
				}
				var one int
				if err := tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one); !errors.Is(err, idemsql.ErrTxRolledBack) {
					t.Errorf("QueryRowContext after Rollback = %v, want ErrTxRolledBack", err)
				}
				rows, err := tx.QueryContext(ctx, `SELECT 1`)
				if err == nil {
					rows.Close()
				}
				if !errors.Is(err, idemsql.ErrTxRolledBack) {
					t.Errorf("QueryContext after Rollback = %v, want ErrTxRolledBack", err)
				}
				stmt, err := tx.PrepareContext(ctx, `SELECT 1`)
				if err == nil {
					stmt.Close()
				}
				if !errors.Is(err, idemsql.ErrTxRolledBack) {
					t.Errorf("PrepareContext after Rollback = %v, want ErrTxRolledBack", err)
				}
				if err := tx.Rollback(); err != nil {
					t.Errorf("a second Rollback: %v", err)
				}
				return idem.Result{Status: 402, Body: []byte("declined")}, nil
			}
			for i := range 2 {
				out, err := engine.Do(ctx, op, handler)
				if err != nil || out.Result.Status != 402 || string(out.Result.Body) != "declined" || out.Replayed != (i == 1) {
					t.Fatalf("wrote %v, Do %d = %+v, %v; want the 402, then its replay", wrote, i, out, err)
				}
			}
			if runs != 1 {
				t.Errorf("the handler ran %d times, want 1", runs)
			}
			mustCount(t, env, business, 0)
			mustCount(t, env, after, 0)
		}
	})
}

// TestHandlerCommitRefused: Commit is refused with an error that says
// what the handler can do instead, and the transaction goes on to commit
// with the answer.
func TestHandlerCommitRefused(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		engine := newEngine(t, env.store, nil)
		business := newName("order")
		out, err := engine.Do(ctx, idem.Operation{Tenant: newName("tenant"), Key: "k"}, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, business); err != nil {
				return idem.Result{}, err
			}
			err := idemsql.TxFromContext(ctx).Commit()
			if !errors.Is(err, idemsql.ErrTxOwned) {
				t.Errorf("Commit = %v, want ErrTxOwned", err)
			}
			for _, hint := range []string{"Return normally", "Rollback", "idem.RollbackWrites(ctx)", "idem.NotExecuted(ctx)"} {
				if err == nil || !strings.Contains(err.Error(), hint) {
					t.Errorf("Commit's error %q does not mention %q", err, hint)
				}
			}
			return idem.Result{Status: 201}, nil
		})
		if err != nil || out.Result.Status != 201 {
			t.Fatalf("Do = %+v, %v", out, err)
		}
		mustCount(t, env, business, 1)
	})
}

// TestAnswerAfterFailedStatement: a handler catches a unique violation and
// answers 409. The answer is stored and replayed as it wrote it. On
// PostgreSQL the failed statement aborted the transaction, so its other
// writes are rolled back; elsewhere the transaction went on, and they
// commit with the answer.
func TestAnswerAfterFailedStatement(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		if _, err := env.db.ExecContext(ctx, `CREATE TABLE accounts (name VARCHAR(64) PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if _, err := env.db.ExecContext(ctx, `INSERT INTO accounts (name) VALUES ('ada')`); err != nil {
			t.Fatal(err)
		}
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "signup-1"}
		audit := newName("audit")
		runs := 0
		handler := func(ctx context.Context) (idem.Result, error) {
			runs++
			if err := env.businessWrite(ctx, audit); err != nil {
				return idem.Result{}, err
			}
			_, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO accounts (name) VALUES ('ada')`)
			if err == nil {
				return idem.Result{}, errors.New("the duplicate account was inserted")
			}
			return idem.Result{Status: 409, Body: []byte("account exists")}, nil
		}
		for i := range 2 {
			out, err := engine.Do(ctx, op, handler)
			if err != nil || out.Result.Status != 409 || string(out.Result.Body) != "account exists" || out.Replayed != (i == 1) {
				t.Fatalf("Do %d = %+v, %v; want the 409, then its replay", i, out, err)
			}
		}
		if runs != 1 {
			t.Errorf("the handler ran %d times, want 1", runs)
		}
		want := 1
		if env.dialect == idemsql.Postgres {
			want = 0
		}
		mustCount(t, env, audit, want)
	})
}

// TestTxAfterTheHandler: a Tx kept past its handler's return refuses
// every statement, with sql.ErrTxDone, instead of running it on a
// connection that may serve another request by then.
func TestTxAfterTheHandler(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		engine := newEngine(t, env.store, nil)
		var kept *idemsql.Tx
		_, err := engine.Do(ctx, idem.Operation{Tenant: newName("tenant"), Key: "k"}, func(ctx context.Context) (idem.Result, error) {
			kept = idemsql.TxFromContext(ctx)
			return idem.Result{Status: 201}, env.businessWrite(ctx, newName("order"))
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kept.ExecContext(ctx, `INSERT INTO business (id) VALUES ('late')`); !errors.Is(err, sql.ErrTxDone) {
			t.Errorf("ExecContext after the handler = %v, want sql.ErrTxDone", err)
		}
		if err := kept.QueryRowContext(ctx, `SELECT 1`).Err(); !errors.Is(err, sql.ErrTxDone) {
			t.Errorf("QueryRowContext after the handler = %v, want sql.ErrTxDone", err)
		}
		mustCount(t, env, "late", 0)
	})
}

// TestCommitSentAsSQL: a handler that ends its transaction itself, with
// COMMIT sent as SQL text, has no answer stored: the completion finds its
// transaction is no longer the one it began.
func TestCommitSentAsSQL(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "k"}
		_, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			if err := env.businessWrite(ctx, newName("order")); err != nil {
				return idem.Result{}, err
			}
			if _, err := idemsql.TxFromContext(ctx).ExecContext(ctx, "COMMIT"); err != nil {
				return idem.Result{}, err
			}
			return idem.Result{Status: 201}, nil
		})
		if !errors.Is(err, idemsql.ErrTxEnded) {
			t.Errorf("Do = %v, want an error wrapping idemsql.ErrTxEnded", err)
		}
		if _, err := env.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("Get = %v, want ErrNotFound (nothing stored, released)", err)
		}
	})
}

// TestSuccessAfterAbortNotStored: a handler that swallows a failed
// statement and answers a success would have a result stored whose writes
// PostgreSQL undid. Do returns idem.ErrWritesAborted instead, stores
// nothing and releases the key, so the retry runs again. Elsewhere the
// transaction survived the failed statement, and the success commits.
func TestSuccessAfterAbortNotStored(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		ctx := context.Background()
		accounts := strings.ReplaceAll(newName("accounts"), "-", "_")
		if _, err := env.db.ExecContext(ctx, `CREATE TABLE `+accounts+` (name VARCHAR(64) PRIMARY KEY)`); err != nil {
			t.Fatal(err)
		}
		if _, err := env.db.ExecContext(ctx, `INSERT INTO `+accounts+` (name) VALUES ('ada')`); err != nil {
			t.Fatal(err)
		}
		engine := newEngine(t, env.store, nil)
		op := idem.Operation{Tenant: newName("tenant"), Key: "signup-ok"}
		order := newName("order")
		runs := 0
		handler := func(ctx context.Context) (idem.Result, error) {
			runs++
			if err := env.businessWrite(ctx, order); err != nil {
				return idem.Result{}, err
			}
			// The error is swallowed: a bug, or a "best effort" insert.
			_, _ = idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO `+accounts+` (name) VALUES ('ada')`)
			return idem.Result{Status: 201}, nil
		}
		out, err := engine.Do(ctx, op, handler)
		if env.dialect != idemsql.Postgres {
			if err != nil || out.Result.Status != 201 {
				t.Fatalf("Do = %+v, %v; want the 201 committed", out, err)
			}
			mustCount(t, env, order, 1)
			return
		}
		if !errors.Is(err, idem.ErrWritesAborted) {
			t.Fatalf("Do = %+v, %v; want idem.ErrWritesAborted", out, err)
		}
		if _, err := env.store.Get(ctx, op.Tenant, op.Key); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("record after the refused success: %v; want none (key released)", err)
		}
		mustCount(t, env, order, 0)
		if _, err := engine.Do(ctx, op, handler); !errors.Is(err, idem.ErrWritesAborted) || runs != 2 {
			t.Fatalf("retry: %v after %d runs; want the handler run again, refused again", err, runs)
		}
	})
}
