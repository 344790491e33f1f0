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
	"github.com/jackc/pgx/v5"
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
// with the COMMIT. A replay costs one, the claim. A handler that sends no
// query costs two, the claim and the completion alone; one whose
// statement fails and that answers all the same costs three: the claim,
// BEGIN with the failing statement, ROLLBACK with the completion. A step
// (idem.Step) costs one more: its own UPDATE.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	url := testenv.PostgresSchema(t)
	// One warm connection, its statements prepared.
	pool, writes := countingPool(t, url, pgx.QueryExecModeCacheStatement)
	if err := idempg.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, businessTable); err != nil {
		t.Fatal(err)
	}
	eng := mustEngine(t, testenv.Must(idempg.NewStore(pool, nil)))
	// pgx forgets a prepared statement that failed, and the BEGIN sent in
	// its batch, and then deallocates and prepares them again: two round
	// trips of pgx's after every failure. A pool that prepares nothing
	// counts the store's alone.
	unprepared, unpreparedWrites := countingPool(t, url, pgx.QueryExecModeExec)
	unpreparedEng := mustEngine(t, testenv.Must(idempg.NewStore(unprepared, nil)))

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
	// A step recorded before the business write, as a charge before the
	// order: one UPDATE of its own, through the pool, then the order.
	step := func(i int) error {
		_, err := eng.Do(ctx, idem.Operation{Tenant: "t", Key: fmt.Sprint("step", i)}, func(ctx context.Context) (idem.Result, error) {
			if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
				return idem.Result{}, err
			}
			return createOrder(int64(i))(ctx)
		})
		return err
	}
	bare := func(i int) error { return bareInsert(ctx, pool, int64(i)) }
	noQuery := func(i int) error {
		_, err := eng.Do(ctx, idem.Operation{Tenant: "t", Key: fmt.Sprint("nq", i)}, func(context.Context) (idem.Result, error) {
			return idem.Result{Status: 200}, nil
		})
		return err
	}
	// A unique violation on the order that k0 created: the answer is
	// stored alone, in the round trip that rolls the transaction back.
	afterError := func(i int) error {
		out, err := unpreparedEng.Do(ctx, idem.Operation{Tenant: "t", Key: fmt.Sprint("dup", i)}, func(ctx context.Context) (idem.Result, error) {
			_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (id, ref) VALUES (1, $1)`, "dup")
			if err == nil {
				return idem.Result{}, fmt.Errorf("the duplicate order was inserted")
			}
			return idem.Result{Status: 409}, nil
		})
		if err == nil && out.Result.Status != 409 {
			err = fmt.Errorf("answered %d", out.Result.Status)
		}
		return err
	}

	cost := func(name string, writes *atomic.Int64, op func(int) error) int64 {
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
	if got := cost("bare BEGIN; INSERT; COMMIT", writes, bare); got != 3 {
		t.Errorf("bare transaction: %d round trips, want 3", got)
	}
	if got := cost("engine, fresh key", writes, fresh); got != 3 {
		t.Errorf("fresh request: %d round trips, want 3: claim, BEGIN+INSERT, complete+COMMIT", got)
	}
	if got := cost("engine, fresh key, one step", writes, step); got != 4 {
		t.Errorf("fresh request with a step: %d round trips, want 4: claim, step, BEGIN+INSERT, complete+COMMIT", got)
	}
	if got := cost("engine, replay", writes, replay); got != 1 {
		t.Errorf("replay: %d round trips, want 1", got)
	}
	if got := cost("engine, handler without queries", writes, noQuery); got != 2 {
		t.Errorf("handler without queries: %d round trips, want 2: claim, complete (no BEGIN, no COMMIT)", got)
	}
	if got := cost("engine, answer after a failed statement", unpreparedWrites, afterError); got != 3 {
		t.Errorf("answer after a failed statement: %d round trips, want 3: claim, BEGIN+INSERT, ROLLBACK+complete", got)
	}
}

// countingPool returns a pool of one connection to url whose writes, one
// per round trip, are counted.
func countingPool(t *testing.T, url string, mode pgx.QueryExecMode) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	writes := new(atomic.Int64)
	cfg.MaxConns = 1
	cfg.ConnConfig.DefaultQueryExecMode = mode
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return countingConn{c, writes}, err
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	return pool, writes
}
