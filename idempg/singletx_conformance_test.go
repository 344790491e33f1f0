package idempg_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemstoretest"
)

// TestSingleTransactionConformance runs the store conformance suite on
// stores in the single-transaction mode: the cases that go through the
// engine claim inside the handler's transaction; those that call Claim
// directly see the default mode's claim, which the mode keeps for other
// callers of the table.
func TestSingleTransactionConformance(t *testing.T) {
	e := newEnvWith(t, 8, &idempg.Config{SingleTransaction: true})
	business := func(ctx context.Context, id string) error { return insertOrder(ctx, id) }
	count := func(ctx context.Context, id string) (int, error) {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE ref = $1`, id).Scan(&n)
		return n, err
	}
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		return &idemstoretest.Fixture{Store: e.store, Peer: e.other, BusinessWrite: business, BusinessCount: count}
	}, idemstoretest.Capabilities{Transactional: true, SingleTransaction: true})
}
