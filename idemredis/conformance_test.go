package idemredis

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemstoretest"
	"github.com/idem-go/idem/internal/testenv"
)

// TestConformance runs the shared store suite. Each case gets a prefix of
// its own; Peer is a second Store on a second client (its own connection
// pool) with the same prefix, as a second process would hold.
//
// Not Transactional: Tx.Complete cannot commit with a business write.
// SelfExpiring: retention is the key's TTL, so Redis deletes expired
// records itself and Purge finds none.
//
// The suite runs one level down, under "redis", so that every store's
// cases have the same names, TestConformance/<store>/<area>/<case>, as
// the docs cite them (idempg and idemsql name their claim modes and
// dialects there).
func TestConformance(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
			prefix := testenv.Name()
			return &idemstoretest.Fixture{
				Store: newStoreOn(t, newClient(t, -1), prefix),
				Peer:  newStoreOn(t, newClient(t, -1), prefix),
			}
		}, idemstoretest.Capabilities{Transactional: false, SelfExpiring: true})
	})
}
