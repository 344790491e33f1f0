package ideminbox_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemmem"
)

// A message delivered twice (the consumer crashed after its commit, before
// its ack) takes effect once. With idemsql or idempg, the handler writes
// through the store's transaction and its rows commit with the dedup
// record; idemmem keeps the example free of any server.
func Example() {
	inbox, err := ideminbox.New(ideminbox.Config{
		Store:    idemmem.New(nil),
		Consumer: "order-projector",
	})
	if err != nil {
		panic(err)
	}
	orders := 0
	handle := func(ctx context.Context) error {
		orders++ // with SQL: idemsql.Tx(ctx).ExecContext(ctx, "INSERT INTO orders …")
		return nil
	}
	for attempt := 1; attempt <= 2; attempt++ {
		msg := ideminbox.Message{ID: "order-42", Attempt: attempt, Subject: "order.created"}
		decision, err := inbox.Process(context.Background(), msg, handle)
		fmt.Println(decision.Action, err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// ack <nil>
	// ack-duplicate <nil>
	// orders: 1
}
