package idemfront_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemmem"
)

// A front end answers the engine's errors by their kind, in its own
// protocol's codes: here, gRPC's.
func Example() {
	engine, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	front, _ := idemfront.NewFront(engine, nil)

	grpcCode := func(a idemfront.Answer) string {
		switch a.Kind {
		case idemfront.InFlight, idemfront.StoreUnavailable:
			return fmt.Sprintf("UNAVAILABLE, retry in %v", a.RetryAfter)
		case idemfront.Mismatch:
			return "FAILED_PRECONDITION"
		case idemfront.InvalidKey:
			return "INVALID_ARGUMENT"
		}
		return "INTERNAL"
	}
	ctx := context.Background()
	op := idem.Operation{Tenant: "acme", Key: "order-1", Fingerprint: []byte("first")}
	run := func(context.Context) (idem.Result, error) { return idem.Result{Body: []byte("ok")}, nil }
	if _, err := engine.Do(ctx, op, run); err != nil {
		panic(err)
	}

	op.Fingerprint = []byte("another request")
	_, err := engine.Do(ctx, op, run)
	fmt.Println(grpcCode(front.Classify(err, idemfront.State{Ctx: ctx})))

	op.Key = "not a key"
	_, err = engine.Do(ctx, op, run)
	fmt.Println(grpcCode(front.Classify(err, idemfront.State{Ctx: ctx})))
	fmt.Println(grpcCode(front.Classify(idem.ErrInFlight, idemfront.State{Ctx: ctx})))
	// Output:
	// FAILED_PRECONDITION
	// INVALID_ARGUMENT
	// UNAVAILABLE, retry in 1s
}
