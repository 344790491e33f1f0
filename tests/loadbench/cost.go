package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The cost mode answers "where does the time go" without HTTP and without
// contention: each piece of a request runs n times in a row on ONE
// connection, and the CPU of that connection's backend and of this
// process is divided by n. Under load every piece costs more (lock
// waits, cache misses, context switches), but the shares stay.

// cost is what one piece costs, per execution.
type cost struct {
	name       string
	wall       time.Duration
	backendCPU time.Duration
	goCPU      time.Duration
	roundTrips float64
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// measureCosts runs each piece n times on a pool of one connection over
// db's schema.
func measureCosts(ctx context.Context, db *database, n int) ([]cost, error) {
	cfg, err := pgxpool.ParseConfig(db.base)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns, cfg.MinConns = 1, 1
	cfg.ConnConfig.RuntimeParams["search_path"] = db.schema
	var writes atomic.Int64
	var reads atomic.Int64
	dial := cfg.ConnConfig.DialFunc
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: &writes, reads: &reads}, nil
	}
	var pid uint32
	cfg.AfterConnect = func(_ context.Context, c *pgx.Conn) error {
		pid = c.PgConn().PID()
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return nil, err
	}

	store, err := idempg.NewStore(pool, nil)
	if err != nil {
		return nil, err
	}
	// No heartbeat: its timer is Go CPU that a serial loop of short
	// operations would never let fire, and it would blur the store's
	// share.
	engine, err := idem.NewEngine(store, &idem.Config{Heartbeat: -1})
	if err != nil {
		return nil, err
	}
	result := idem.Result{
		Status: http.StatusCreated,
		Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
		Body:   []byte(`{"id":1,"tenant_id":"t1","cart_id":"cart_42","total_cents":1200,"created_at":"2026-11-30T09:00:00.000000+00"}`),
	}
	var seq atomic.Int64
	key := func() string { return fmt.Sprintf("cost-%d-%d", time.Now().UnixNano(), seq.Add(1)) }
	insert := func(ctx context.Context, tx pgx.Tx, k string) error {
		var id int64
		var at string
		return tx.QueryRow(ctx, insertOrder, tenant, "cart_42", 1200, k).Scan(&id, &at)
	}
	fingerprint := make([]byte, 32)
	const replayKey = "cost-replayed"

	pieces := []struct {
		name string
		op   func() error
	}{
		{"SELECT 1: one round trip, the floor", func() error {
			var one int
			return pool.QueryRow(ctx, "SELECT $1::int", 1).Scan(&one)
		}},
		{"INSERT alone (autocommit, synchronous)", func() error {
			var id int64
			var at string
			return pool.QueryRow(ctx, insertOrder, tenant, "cart_42", 1200, key()).Scan(&id, &at)
		}},
		{"bare: BEGIN; INSERT; COMMIT (pgx.BeginFunc)", func() error {
			return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return insert(ctx, tx, key()) })
		}},
		{"claim alone (fresh key; its own asynchronous commit)", func() error {
			_, err := store.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key(), Fingerprint: fingerprint,
				Token: seq.Add(1), Lease: 90 * time.Second, Retention: 24 * time.Hour})
			return err
		}},
		{"claim alone, held key (what a replay sends)", func() error {
			_, err := store.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: replayKey, Fingerprint: fingerprint,
				Token: seq.Add(1), Lease: 90 * time.Second, Retention: 24 * time.Hour})
			return err
		}},
		{"engine: claim; BEGIN+INSERT; complete+COMMIT", func() error {
			k := key()
			_, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: k, Fingerprint: fingerprint},
				func(ctx context.Context) (idem.Result, error) {
					return result, insert(ctx, idempg.TxFromContext(ctx), k)
				})
			return err
		}},
		{"engine: replay", func() error {
			_, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: replayKey, Fingerprint: fingerprint},
				func(ctx context.Context) (idem.Result, error) {
					return result, insert(ctx, idempg.TxFromContext(ctx), replayKey)
				})
			return err
		}},
	}
	if _, err := engine.Do(ctx, idem.Operation{Tenant: tenant, Key: replayKey, Fingerprint: fingerprint},
		func(ctx context.Context) (idem.Result, error) {
			return result, insert(ctx, idempg.TxFromContext(ctx), replayKey)
		}); err != nil {
		return nil, err
	}
	var out []cost
	for _, p := range pieces {
		// A few unmeasured runs: the statement caches and PostgreSQL's
		// generic plans (chosen after five executions) are in place first.
		for range 10 {
			if err := p.op(); err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
		}
		w0, t0, c0, b0 := writes.Load(), time.Now(), selfCPU(), backendCPU([]uint32{pid})
		for range n {
			if err := p.op(); err != nil {
				return nil, fmt.Errorf("%s: %w", p.name, err)
			}
		}
		out = append(out, cost{
			name:       p.name,
			wall:       time.Since(t0) / time.Duration(n),
			goCPU:      (selfCPU() - c0) / time.Duration(n),
			backendCPU: (backendCPU([]uint32{pid}) - b0) / time.Duration(n),
			roundTrips: float64(writes.Load()-w0) / float64(n),
		})
	}
	return out, nil
}

func writeCosts(w io.Writer, n int, costs []cost) {
	fmt.Fprintf(w, "### Cost of each piece, serial, one connection, %d runs each\n\n", n)
	fmt.Fprintf(w, "| piece | wall/op | backend CPU/op | Go CPU/op | round trips/op |\n|---|--:|--:|--:|--:|\n")
	for _, c := range costs {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.2f |\n", c.name, us(c.wall), us(c.backendCPU), us(c.goCPU), c.roundTrips)
	}
	fmt.Fprintln(w)
}
