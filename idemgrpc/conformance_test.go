package idemgrpc_test

import (
	"testing"

	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgrpc/idemgrpctest"
)

// TestConformance runs the front-end suite against the interceptor over
// a real grpc-go server on idemmem; tests/idemgrpc runs it on SQLite and
// PostgreSQL.
func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, idemgrpctest.Harness{}, idemgrpctest.Features, nil)
}
