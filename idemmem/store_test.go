package idemmem_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemstoretest"
)

// TestConformance runs the shared suite one level down, under "memory",
// so that every store's cases have the same names,
// TestConformance/<store>/<area>/<case>, as the docs cite them.
func TestConformance(t *testing.T) {
	t.Run("memory", func(t *testing.T) { conformance(t) })
}

func conformance(t *testing.T) {
	idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
		s := idemmem.NewStore(nil)
		// The memory store lives in one process: the in-process
		// equivalent of a second process on the same database is a second
		// handle on the same *Store, and every goroutine already shares
		// it. Giving it as Peer runs the cross-process cases (half of
		// the racing claims, takeovers by the "other process") instead of
		// skipping them.
		return &idemstoretest.Fixture{Store: s, Peer: s}
	}, idemstoretest.Capabilities{Transactional: false})
}
