package idempg_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5/pgxpool"
)

// benchGoroutines is how many requests the parallel benchmarks keep in
// flight, whatever -cpu says.
const benchGoroutines = 16

// runBench runs op serially (latency: round trips and commit flushes)
// and from benchGoroutines goroutines (throughput under contention).
func runBench(b *testing.B, op func(ctx context.Context, i int64) error) {
	ctx := context.Background()
	var seq atomic.Int64
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			if err := op(ctx, seq.Add(1)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("parallel%d", benchGoroutines), func(b *testing.B) {
		b.SetParallelism((benchGoroutines + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := op(ctx, seq.Add(1)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// benchEnv is an env whose pools hold a connection per goroutine.
func benchEnv(b *testing.B) *env {
	return newEnv(b, benchGoroutines)
}

// BenchmarkBareTx is the physical floor: the same business write without
// idem, BEGIN; INSERT; COMMIT (three round trips, one WAL flush).
func BenchmarkBareTx(b *testing.B) {
	e := benchEnv(b)
	runBench(b, func(ctx context.Context, i int64) error { return bareInsert(ctx, e.pool, i) })
}

func bareInsert(ctx context.Context, pool *pgxpool.Pool, i int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, fmt.Sprint(i)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// BenchmarkEngineFresh runs the same write through idem with a new key
// each time: claim, BEGIN, INSERT, complete+COMMIT.
func BenchmarkEngineFresh(b *testing.B) {
	e := benchEnv(b)
	eng := mustEngine(b, e.store)
	runBench(b, func(ctx context.Context, i int64) error {
		_, err := eng.Do(ctx, idem.Operation{Tenant: "bench", Key: fmt.Sprint("fresh-", i)}, createOrder(i))
		return err
	})
}

// BenchmarkEngineStep is BenchmarkEngineFresh with a step recorded
// (idem.Step) before the write, as a charge before the order: one more
// round trip and one more synchronous commit, its own.
func BenchmarkEngineStep(b *testing.B) {
	e := benchEnv(b)
	eng := mustEngine(b, e.store)
	runBench(b, func(ctx context.Context, i int64) error {
		_, err := eng.Do(ctx, idem.Operation{Tenant: "bench", Key: fmt.Sprint("step-", i)}, func(ctx context.Context) (idem.Result, error) {
			if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
				return idem.Result{}, err
			}
			return createOrder(i)(ctx)
		})
		return err
	})
}

// BenchmarkEngineReplay retries one completed operation: the claim alone
// answers, with the stored result.
func BenchmarkEngineReplay(b *testing.B) {
	e := benchEnv(b)
	eng := mustEngine(b, e.store)
	ctx := context.Background()
	op := idem.Operation{Tenant: "bench", Key: "replayed", Fingerprint: []byte("fp")}
	if _, err := eng.Do(ctx, op, createOrder(0)); err != nil {
		b.Fatal(err)
	}
	runBench(b, func(ctx context.Context, i int64) error {
		out, err := eng.Do(ctx, op, createOrder(i))
		if err == nil && !out.Replayed {
			err = fmt.Errorf("operation %d ran again", i)
		}
		return err
	})
}

func createOrder(i int64) func(ctx context.Context) (idem.Result, error) {
	return func(ctx context.Context) (idem.Result, error) {
		if _, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, fmt.Sprint(i)); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
			Body: []byte(`{"id":"ord_1"}`)}, nil
	}
}
