package idemkeys_test

import (
	"context"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
	"github.com/idem-go/idem/idemmem"
)

// An operator lists one tenant's keys and reads where each stands.
func Example() {
	ctx := context.Background()
	store := idemmem.NewStore(nil)
	engine, _ := idem.NewEngine(store, nil)
	defer engine.Close(ctx)
	for _, key := range []string{"order-1", "order-2"} {
		op := idem.Operation{Tenant: "acme", Key: key, Fingerprint: []byte("POST /orders")}
		_, _ = engine.Do(ctx, op, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{Status: 201, Body: []byte(`{"id":1}`)}, nil
		})
	}

	lister := idem.Store(store).(idemkeys.Lister)
	page, err := lister.ListKeys(ctx, idemkeys.ListParams{Tenant: "acme"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range page.Records {
		fmt.Println(r.Key, idemkeys.StatusOf(r, page.Now))
	}
	stats, _ := lister.KeyStats(ctx, idemkeys.StatsParams{Tenant: "acme"})
	fmt.Println("complete:", stats.Tenants[0].Complete)
	// Output:
	// order-1 complete
	// order-2 complete
	// complete: 2
}
