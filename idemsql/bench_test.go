package idemsql_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// BenchmarkExecution measures one whole execution on each dialect: claim,
// begin, business write, fenced completion and commit.
func BenchmarkExecution(b *testing.B) {
	for _, d := range dialects {
		b.Run(d.Name(), func(b *testing.B) {
			env := newTestDB(b, d)
			ctx := context.Background()
			tenant := newName("bench")
			for i := 0; b.Loop(); i++ {
				key := strconv.Itoa(i)
				p := idem.ClaimParams{Tenant: tenant, Key: key, Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour}
				if res, err := env.store.Claim(ctx, p); err != nil || !res.Won {
					b.Fatalf("claim: %v %v", res.Won, err)
				}
				tx, err := env.store.Begin(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := env.businessWrite(tx.Context(ctx), key); err != nil {
					b.Fatal(err)
				}
				if err := tx.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: p.Token, Result: idem.Result{Status: 201}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
