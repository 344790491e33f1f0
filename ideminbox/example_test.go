package ideminbox_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemmem"
)

// A message delivered twice (the consumer crashed after its commit, before
// its ack) takes effect once. With idemsql or idempg, the handler writes
// through the store's transaction and its rows commit with the dedup
// record; idemmem keeps the example free of any server.
func Example() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		panic(err)
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{
		Consumer: "order-projector",
	})
	if err != nil {
		panic(err)
	}
	orders := 0
	handle := func(ctx context.Context) error {
		orders++ // with SQL: idemsql.TxFromContext(ctx).ExecContext(ctx, "INSERT INTO orders …")
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

// A message whose handler fails on its last allowed delivery is recorded
// as poison, with its payload and error, handed to the dead-letter hook
// and acknowledged; its later copies are acknowledged without running.
func ExampleInbox_Status() {
	engine, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		panic(err)
	}
	inbox, err := ideminbox.NewInbox(engine, &ideminbox.Config{
		Consumer:    "order-projector",
		MaxAttempts: 2,
		DeadLetterFunc: func(ctx context.Context, msg ideminbox.Message, cause error) error {
			// With SQL, insert into a dead-letter table through the
			// transaction: it commits with the poison record.
			fmt.Println("dead letter:", msg.ID, cause)
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	failing := func(ctx context.Context) error { return errors.New("malformed order") }
	for attempt := 1; attempt <= 3; attempt++ {
		msg := ideminbox.Message{ID: "order-13", Attempt: attempt, Data: []byte(`{"id":`)}
		decision, _ := inbox.Process(context.Background(), msg, failing)
		fmt.Println(attempt, decision.Action)
	}
	st, _ := inbox.Status(context.Background(), "order-13")
	fmt.Printf("%s after attempt %d: %s, payload %s\n", st.State, st.Attempt, st.Error, st.Data)
	// Output:
	// 1 nack
	// dead letter: order-13 malformed order
	// 2 ack-poison
	// 3 ack-duplicate
	// poison after attempt 2: malformed order, payload {"id":
}
