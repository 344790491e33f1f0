package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
)

// firstWrites are the ways a handler's first statement may reach the
// transaction; most carry the BEGIN in front of them (see "BEGIN rides
// with the first query"). Each inserts one order tagged ref.
var firstWrites = map[string]func(ctx context.Context, ref string) error{
	"Exec": func(ctx context.Context, ref string) error {
		_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, ref)
		return err
	},
	"ExecNoArgumentsTwoStatements": func(ctx context.Context, ref string) error {
		// Simple protocol: two statements in one string, ref is a test
		// constant.
		_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (ref) VALUES ('`+ref+`'); SELECT 1`)
		return err
	},
	"Query": func(ctx context.Context, ref string) error {
		rows, err := idempg.TxFromContext(ctx).Query(ctx, `INSERT INTO orders (ref) VALUES ($1), ($1) RETURNING id`, ref)
		if err != nil {
			return err
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err == nil && len(ids) != 2 {
			err = errors.New("want 2 ids")
		}
		if err != nil {
			return err
		}
		// Undo one of the two, so one row stays as in the other kinds.
		_, err = idempg.TxFromContext(ctx).Exec(ctx, `DELETE FROM orders WHERE id = $1`, ids[1])
		return err
	},
	"QueryRow": func(ctx context.Context, ref string) error {
		var id int64
		return idempg.TxFromContext(ctx).QueryRow(ctx, `INSERT INTO orders (ref) VALUES ($1) RETURNING id`, ref).Scan(&id)
	},
	"SendBatch": func(ctx context.Context, ref string) error {
		b := &pgx.Batch{}
		b.Queue(`INSERT INTO orders (ref) VALUES ($1)`, ref)
		var n int
		b.Queue(`SELECT count(*) FROM orders WHERE ref = $1`, ref).QueryRow(func(row pgx.Row) error { return row.Scan(&n) })
		if err := idempg.TxFromContext(ctx).SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if n != 1 {
			return errors.New("the batch's second query did not see its first")
		}
		return nil
	},
	"CopyFrom": func(ctx context.Context, ref string) error {
		_, err := idempg.TxFromContext(ctx).CopyFrom(ctx, pgx.Identifier{"orders"}, []string{"ref"}, pgx.CopyFromRows([][]any{{ref}}))
		return err
	},
	"Savepoint": func(ctx context.Context, ref string) error {
		sp, err := idempg.TxFromContext(ctx).Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, ref); err != nil {
			return err
		}
		return sp.Commit(ctx)
	},
	"PrepareThenExec": func(ctx context.Context, ref string) error {
		if _, err := idempg.TxFromContext(ctx).Prepare(ctx, "ins", `INSERT INTO orders (ref) VALUES ($1)`); err != nil {
			return err
		}
		_, err := idempg.TxFromContext(ctx).Exec(ctx, "ins", ref)
		return err
	},
	"Conn": func(ctx context.Context, ref string) error {
		_, err := idempg.TxFromContext(ctx).Conn().Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, ref)
		return err
	},
}

// TestFirstStatementKinds: whatever the handler's first statement, its
// write commits with the completion, and is rolled back with it when the
// lease was lost.
func TestFirstStatementKinds(t *testing.T) {
	e := newEnv(t, 2)
	ctx := context.Background()
	eng := mustEngine(t, e.store)
	for name, write := range firstWrites {
		t.Run(name, func(t *testing.T) {
			ref := "ok-" + name
			out, err := eng.Do(ctx, idem.Operation{Tenant: "t", Key: ref}, func(ctx context.Context) (idem.Result, error) {
				return idem.Result{Status: 201}, write(ctx, ref)
			})
			if err != nil || out.Result.Status != 201 {
				t.Fatalf("Do: %+v, %v", out, err)
			}
			if n := e.countOrders(t, ref); n != 1 {
				t.Fatalf("%d orders committed, want 1", n)
			}

			ref = "lost-" + name
			claim := idem.ClaimParams{Tenant: "t", Key: ref, Token: 1, Lease: time.Millisecond, Retention: time.Hour}
			if res, err := e.store.Claim(ctx, claim); err != nil || !res.Won {
				t.Fatalf("claim: %+v, %v", res, err)
			}
			tx, err := e.store.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(ctx)
			if err := write(tx.Context(ctx), ref); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			claim.Token, claim.Lease = 2, time.Hour
			if res, err := e.other.Claim(ctx, claim); err != nil || !res.Won {
				t.Fatalf("takeover: %+v, %v", res, err)
			}
			if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: ref, Token: 1}); !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("complete after takeover: %v, want ErrLeaseLost", err)
			}
			if n := e.countOrders(t, ref); n != 0 {
				t.Fatalf("%d orders survived the lost lease, want 0", n)
			}
		})
	}
}

// TestHandlerWithoutWrites: a handler that sends nothing never begins a
// transaction; its completion commits alone, and is still fenced.
func TestHandlerWithoutWrites(t *testing.T) {
	e := newEnv(t, 1)
	ctx := context.Background()
	if _, err := e.store.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tx, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 2}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with another token: %v, want ErrLeaseLost", err)
	}
	complete(t, e.store, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 204}})
	rec, err := e.store.Get(ctx, "t", "k")
	if err != nil || rec.State != idem.StateComplete || rec.Result.Status != 204 {
		t.Fatalf("record: %+v, %v", rec, err)
	}
	if st := e.pool.Stat(); st.AcquiredConns() != 0 || st.NewConnsCount() != 1 {
		t.Fatalf("pool: %d acquired, %d connections made; want 0 and 1", st.AcquiredConns(), st.NewConnsCount())
	}
}

// TestBeginTakesNoConnection: a unit of work takes its pool connection at
// the handler's first query, not before the handler runs. Sixteen keyed
// requests at once on a pool of four connections (pgxpool's default on
// two CPUs) are all inside their handlers together, before any of them
// queries, as a handler that first calls a slow service would be; a unit
// taking its connection in Begin would let four in at a time.
func TestBeginTakesNoConnection(t *testing.T) {
	e := newEnv(t, 4)
	ctx := context.Background()

	unit, err := e.store.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := e.pool.Stat().AcquiredConns()
	if err := unit.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if held != 0 {
		t.Errorf("Begin holds %d pool connections, want 0", held)
	}

	eng := mustEngine(t, e.store)
	const n = 16
	var inside sync.WaitGroup
	inside.Add(n)
	together := make(chan struct{})
	go func() { inside.Wait(); close(together) }()
	// Only a failure deadline: once it passes, every waiting handler goes
	// on, so that a broken store fails the test instead of hanging it.
	deadline, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	var metAll atomic.Int32
	errs := make([]error, n)
	atOnce(n, func(i int) {
		ref := fmt.Sprint("slow-", i)
		_, errs[i] = eng.Do(ctx, idem.Operation{Tenant: "t", Key: ref}, func(ctx context.Context) (idem.Result, error) {
			inside.Done() // the slow service is called here
			select {
			case <-together:
				metAll.Add(1)
			case <-deadline.Done():
			}
			return idem.Result{Status: 201}, insertOrder(ctx, ref)
		})
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if got := metAll.Load(); got != n {
		t.Fatalf("%d of %d handlers were inside their handler together before the deadline: units hold pool connections before the handler's first query", got, n)
	}
	for i := range n {
		if c := e.countOrders(t, fmt.Sprint("slow-", i)); c != 1 {
			t.Fatalf("request %d: %d orders, want 1", i, c)
		}
	}
}
