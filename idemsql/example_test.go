package idemsql_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

// The handler writes the order in the transaction that stores the result:
// a retry replays the answer and creates nothing.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemsql-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := idemmigrate.Migrate(ctx, db, idemsql.SQLite.MigrateDialect()); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	store, err := idemsql.NewStore(db, idemsql.SQLite)
	if err != nil {
		log.Fatal(err)
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		log.Fatal(err)
	}
	body := `{"item":"book"}`
	fp := sha256.Sum256([]byte("POST /orders " + body))
	op := idem.Operation{Tenant: "acme", Key: "7f9c2ba4-order", Fingerprint: fp[:]}
	createOrder := func(ctx context.Context) (idem.Result, error) {
		res, err := idemsql.TxFromContext(ctx).ExecContext(ctx, `INSERT INTO orders (item) VALUES (?)`, "book")
		if err != nil {
			return idem.Result{}, err
		}
		id, _ := res.LastInsertId()
		return idem.Result{Status: 201, Body: fmt.Appendf(nil, `{"id":%d}`, id)}, nil
	}

	for range 2 { // the client retries
		out, err := engine.Do(ctx, op, createOrder)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(out.Result.Status, string(out.Result.Body), "replayed:", out.Replayed)
	}
	var orders int
	if err := db.QueryRow(`SELECT COUNT(*) FROM orders`).Scan(&orders); err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// 201 {"id":1} replayed: false
	// 201 {"id":1} replayed: true
	// orders: 1
}

// A caller who owns its transaction claims, writes, and completes inside
// it with CompleteTx, then commits.
func ExampleStore_CompleteTx() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "idemsql-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	if err := idemmigrate.Migrate(ctx, db, idemmigrate.SQLite); err != nil {
		log.Fatal(err)
	}
	store, err := idemsql.NewStore(db, idemsql.SQLite)
	if err != nil {
		log.Fatal(err)
	}

	const token = 42 // use a fresh random token per execution
	claim, err := store.Claim(ctx, idem.ClaimParams{
		Tenant: "acme", Key: "msg-1001", Token: token,
		Lease: idem.DefaultLease, Retention: idem.DefaultRetention,
	})
	if err != nil || !claim.Won {
		log.Fatal("not claimed: ", err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // harmless after Commit
	// … business writes in tx …
	err = store.CompleteTx(ctx, tx, idem.CompleteParams{Tenant: "acme", Key: "msg-1001", Token: token, Result: idem.Result{Mode: idem.ModeMarker}})
	if errors.Is(err, idem.ErrLeaseLost) {
		log.Fatal("taken over: the deferred Rollback undoes the business writes")
	}
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}
	rec, err := store.Get(ctx, "acme", "msg-1001")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.State)
	// Output: complete
}
