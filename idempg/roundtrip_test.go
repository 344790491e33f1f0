package idempg_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// countingConn counts the writes a connection makes: pgx buffers each
// round trip's messages and sends them in one write, so writes count
// round trips.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestRoundTrips counts what the design promises, without a clock. The
// same write without idem, through pgx's Begin, Exec and Commit, costs
// three round trips. A fresh request through idem costs three too: the
// claim, the BEGIN riding with the first query, the completion riding
// with the COMMIT. A replay costs one, the claim.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresSchema(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int64
	cfg.MaxConns = 1 // one warm connection, its statements prepared
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return countingConn{c, &writes}, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	defer pool.Close()
	if err := idempg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, businessTable); err != nil {
		t.Fatal(err)
	}
	eng := mustEngine(t, idempg.New(pool))
	fresh := func(i int) error {
		_, err := eng.Do(ctx, idem.Operation{Tenant: "t", Key: fmt.Sprint("k", i)}, createOrder(int64(i)))
		return err
	}
	replay := func(int) error {
		out, err := eng.Do(ctx, idem.Operation{Tenant: "t", Key: "k0"}, createOrder(0))
		if err == nil && !out.Replayed {
			err = fmt.Errorf("not replayed")
		}
		return err
	}
	bare := func(i int) error { return bareInsert(ctx, pool, int64(i)) }

	cost := func(name string, op func(int) error) int64 {
		t.Helper()
		for i := range 3 { // warm up: pgx prepares each statement once per connection
			if err := op(1000 + i); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		before := writes.Load()
		const n = 10
		for i := range n {
			if err := op(i); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		per := (writes.Load() - before) / n
		t.Logf("%s: %d round trips", name, per)
		return per
	}
	if got := cost("bare BEGIN; INSERT; COMMIT", bare); got != 3 {
		t.Errorf("bare transaction: %d round trips, want 3", got)
	}
	if got := cost("engine, fresh key", fresh); got != 3 {
		t.Errorf("fresh request: %d round trips, want 3: claim, BEGIN+INSERT, complete+COMMIT", got)
	}
	if got := cost("engine, replay", replay); got != 1 {
		t.Errorf("replay: %d round trips, want 1", got)
	}
}
