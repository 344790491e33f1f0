package idemredis_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
	"github.com/redis/go-redis/v9"
)

// An operation runs once; its retry gets the stored result back. The
// example runs against the Redis of IDEM_TEST_REDIS
// (redis://127.0.0.1:6379/0 by default).
func Example() {
	ctx := context.Background()
	url := os.Getenv("IDEM_TEST_REDIS")
	if url == "" {
		url = "redis://127.0.0.1:6379/0"
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		panic(err)
	}
	client := redis.NewClient(opt)
	defer client.Close()

	// One prefix per application. This one is fresh on every run, so that
	// runs do not replay each other.
	prefix := fmt.Sprintf("example-%d", time.Now().UnixNano())
	store, err := idemredis.NewStore(client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		panic(err)
	}
	// A one-minute retention keeps the example from leaving records on the
	// server for the default 24h; Redis deletes them by TTL.
	engine, err := idem.NewEngine(store, &idem.Config{Retention: time.Minute})
	if err != nil {
		panic(err)
	}

	op := idem.Operation{Tenant: "acme", Key: "order-42", Fingerprint: []byte("POST /orders cart=42")}
	for range 2 {
		out, err := engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			fmt.Println("creating order 42")
			return idem.Result{Status: 201, Body: []byte(`{"id":42}`)}, nil
		})
		if err != nil {
			panic(err)
		}
		fmt.Println(out.Result.Status, string(out.Result.Body), "replayed:", out.Replayed)
	}
	// Prints (run by TestExamples when the server is up):
	// creating order 42
	// 201 {"id":42} replayed: false
	// 201 {"id":42} replayed: true
}
