package idempg_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// env is one fresh schema, migrated, with a business table, and two pools
// over it: two stores that share nothing but the database, as two
// processes would.
type env struct {
	url          string
	pool, peer   *pgxpool.Pool
	store, other *idempg.Store
}

// businessTable is where handlers in the tests make their writes.
const businessTable = `CREATE TABLE orders (
	id   bigserial PRIMARY KEY,
	ref  text NOT NULL,
	note text
)`

// newEnv sets up an env. maxConns bounds each pool: the server's
// connections are shared with every other test run on the machine.
func newEnv(t testing.TB, maxConns int32) *env {
	t.Helper()
	return newEnvWith(t, maxConns, nil)
}

// claimModes are the two ways a Store sends its claims, for the tests
// that must hold in both.
var claimModes = []struct {
	name   string
	config *idempg.Config
}{
	{"batched", nil},
	{"batched4", &idempg.Config{ClaimConcurrency: 4}},
	{"single", &idempg.Config{ClaimBatchSize: 1}},
}

// newEnvWith is newEnv with both stores built from config.
func newEnvWith(t testing.TB, maxConns int32, config *idempg.Config) *env {
	t.Helper()
	url := testenv.PostgresSchema(t)
	e := &env{url: url, pool: newPool(t, url, maxConns), peer: newPool(t, url, maxConns)}
	ctx := context.Background()
	if err := idempg.Migrate(ctx, e.pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	if _, err := e.pool.Exec(ctx, businessTable); err != nil {
		t.Fatalf("business table: %v", err)
	}
	e.store, e.other = testenv.Must(idempg.NewStore(e.pool, config)), testenv.Must(idempg.NewStore(e.peer, config))
	return e
}

func newPool(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		testenv.Unavailable(t, "PostgreSQL", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// countOrders counts committed business rows tagged ref.
func (e *env) countOrders(t testing.TB, ref string) int {
	t.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE ref = $1`, ref).Scan(&n); err != nil {
		t.Fatalf("count orders: %v", err)
	}
	return n
}

// insertOrder is the handler's business write, through idem's transaction.
func insertOrder(ctx context.Context, ref string) error {
	_, err := idempg.TxFromContext(ctx).Exec(ctx, `INSERT INTO orders (ref) VALUES ($1)`, ref)
	return err
}
