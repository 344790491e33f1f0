package idem_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// A client retries "create order" after a timeout; the order is created
// once and the retry gets the first answer back.
func ExampleEngine_Do() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()

	op := idem.Operation{
		Tenant:      "acct_1", // from authentication, never from the client
		Key:         "7f3a9c1e-order",
		Fingerprint: []byte("POST /orders sku=42"),
	}
	createOrder := func(ctx context.Context) (idem.Result, error) {
		fmt.Println("creating the order")
		return idem.Result{Status: 201, Body: []byte(`{"id":"ord_1"}`)}, nil
	}

	for attempt := 1; attempt <= 2; attempt++ {
		out, err := engine.Do(ctx, op, createOrder)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("attempt %d: %d %s replayed=%v\n", attempt, out.Result.Status, out.Result.Body, out.Replayed)
	}

	// The same key sent with another request is refused, and nothing runs.
	op.Fingerprint = []byte("POST /orders sku=43")
	_, err = engine.Do(ctx, op, createOrder)
	fmt.Println(errors.Is(err, idem.ErrFingerprintMismatch))

	// Output:
	// creating the order
	// attempt 1: 201 {"id":"ord_1"} replayed=false
	// attempt 2: 201 {"id":"ord_1"} replayed=true
	// true
}

// A failed execution releases the key, so the retry runs again instead of
// replaying the failure.
func ExampleEngine_Do_failure() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	op := idem.Operation{Key: "charge-1"}

	attempts := 0
	charge := func(ctx context.Context) (idem.Result, error) {
		attempts++
		if attempts == 1 {
			return idem.Result{}, errors.New("card processor unreachable")
		}
		return idem.Result{Status: 201}, nil
	}

	_, err = engine.Do(ctx, op, charge)
	fmt.Println("first:", err)
	out, err := engine.Do(ctx, op, charge)
	fmt.Println("second:", out.Result.Status, out.Replayed, err)

	// Output:
	// first: card processor unreachable
	// second: 201 false <nil>
}
