package idemstoretest_test

import (
	"context"
	"testing"

	"github.com/idem-go/idem/idemstoretest"
)

// TestExercise runs the suite on the reference store of this package's
// tests, so that every case, the Transactional ones included, is known to
// pass on a correct store before a real one meets it. The variants run side
// by side, each on a store of its own.
func TestExercise(t *testing.T) {
	for _, v := range []struct {
		name string
		caps idemstoretest.Capabilities
		peer bool
		ttl  bool
	}{
		{name: "Transactional", caps: idemstoretest.Capabilities{Transactional: true}, peer: true},
		// A Redis-like store: records expire by themselves, no business
		// transaction, and no Peer, so the cross-process cases skip.
		{name: "SelfExpiring", caps: idemstoretest.Capabilities{SelfExpiring: true}, ttl: true},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			idemstoretest.Exercise(context.Background(), t, func(t *testing.T) *idemstoretest.Fixture {
				s := newRefStore(bugs{})
				s.selfExpiring = v.ttl
				f := &idemstoretest.Fixture{Store: s, BusinessWrite: s.businessWrite, BusinessCount: s.businessCount}
				if v.peer {
					f.Peer = s
				}
				return f
			}, v.caps)
		})
	}
}
