package idempg_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemstoretest"
)

// TestConformance runs idem's store conformance suite. Every case shares
// one schema and two pools (Store and Peer, as two processes); the suite
// keeps cases apart by tenant and business id. It runs with claims in
// batches (the default) and one statement per claim.
func TestConformance(t *testing.T) {
	for _, mode := range claimModes {
		t.Run(mode.name, func(t *testing.T) { testConformance(t, mode.config) })
	}
}

func testConformance(t *testing.T, config *idempg.Config) {
	e := newEnvWith(t, 8, config)
	business := func(ctx context.Context, id string) error { return insertOrder(ctx, id) }
	count := func(ctx context.Context, id string) (int, error) {
		var n int
		err := e.pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE ref = $1`, id).Scan(&n)
		return n, err
	}
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		return &idemstoretest.Fixture{Store: e.store, Peer: e.other, BusinessWrite: business, BusinessCount: count}
	}, idemstoretest.Capabilities{Transactional: true})
}
