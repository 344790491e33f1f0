package idempg_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/internal/testenv"
	"github.com/jackc/pgx/v5/pgxpool"
)

// exampleSchema creates a throwaway schema for an example and returns a
// pool whose connections use it, with a function that drops it.
func exampleSchema(ctx context.Context) (*pgxpool.Pool, func()) {
	url := os.Getenv("IDEM_TEST_POSTGRES")
	if url == "" {
		url = testenv.DefaultPostgres
	}
	schema := testenv.Name()
	admin, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		log.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = schema
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	return pool, func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE")
		admin.Close()
	}
}

// An order created once, whatever the number of retries: the second call
// with the same key replays the stored answer and inserts nothing.
func Example() {
	ctx := context.Background()
	pool, drop := exampleSchema(ctx)
	defer drop()

	if err := idempg.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigserial PRIMARY KEY, ref text NOT NULL, note text)`); err != nil {
		log.Fatal(err)
	}
	store, err := idempg.NewStore(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		log.Fatal(err)
	}

	createOrder := func(ctx context.Context) (idem.Result, error) {
		// The insert commits together with the stored result, or not at all.
		var id int64
		err := idempg.TxFromContext(ctx).QueryRow(ctx, `INSERT INTO orders (ref) VALUES ('book') RETURNING id`).Scan(&id)
		return idem.Result{Status: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, err
	}
	op := idem.Operation{Tenant: "customer-42", Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"}
	for range 2 {
		out, err := engine.Do(ctx, op, createOrder)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Result.Status, string(out.Result.Body), "replayed:", out.Replayed)
	}
	var orders int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Prints (run by TestExamples when the server is up):
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders: 1
}

// CompleteTx completes a record inside a transaction the caller owns, as a
// message consumer or a job queue does: the claim first, then the
// business write and the completion in one transaction.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	pool, drop := exampleSchema(ctx)
	defer drop()
	if err := idempg.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	store, err := idempg.NewStore(pool, nil)
	if err != nil {
		log.Fatal(err)
	}

	claim, err := store.Claim(ctx, idem.ClaimParams{Tenant: "consumer", Key: "msg-1", Token: 1,
		Lease: idem.DefaultLease, Retention: idem.DefaultRetention})
	if err != nil || !claim.Won {
		log.Fatal("claim: ", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// … the consumer's business writes in tx …
	if err := store.CompleteTx(ctx, tx, idem.CompleteParams{Tenant: "consumer", Key: "msg-1", Token: 1}); err != nil {
		log.Fatal(err) // idem.ErrLeaseLost: roll back, do not ack
	}
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	rec, err := store.Get(ctx, "consumer", "msg-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.State)
	// Prints (run by TestExamples when the server is up): complete
}

// Claims made at the same time share one statement (up to
// ClaimBatchSize). Twenty requests with twenty keys, released together:
// the first goes out alone, the others queue behind it and follow in one
// or two statements, and each key is claimed once.
func ExampleNewStore() {
	ctx := context.Background()
	pool, drop := exampleSchema(ctx)
	defer drop()
	if err := idempg.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}
	store, err := idempg.NewStore(pool, &idempg.Config{ClaimBatchSize: 16})
	if err != nil {
		log.Fatal(err)
	}

	start := make(chan struct{})
	won := make(chan bool, 20)
	for i := range 20 {
		go func() {
			<-start
			res, err := store.Claim(ctx, idem.ClaimParams{
				Tenant: "acme", Key: fmt.Sprintf("order-%d", i),
				Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour,
			})
			if err != nil {
				log.Fatal(err)
			}
			won <- res.Won
		}()
	}
	close(start)
	claimed := 0
	for range 20 {
		if <-won {
			claimed++
		}
	}
	fmt.Println("claimed:", claimed)
}
