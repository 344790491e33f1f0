// Package rpcfront runs the front-end suite against idemgrpc and
// idemconnect on transactional stores (SQLite and PostgreSQL): the
// handler's writes, through the context, commit with its answer and roll
// back with its failures, as over HTTP.
package rpcfront

import (
	"testing"

	"github.com/idem-go/idem/idemconnect/idemconnecttest"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgrpc/idemgrpctest"
	"github.com/idem-go/idem/tests/internal/frontstore"
)

// harnesses are the RPC front ends, each over its real transport.
var harnesses = map[string]struct {
	h idemfronttest.Harness
	f idemfronttest.Features
}{
	"grpc":         {idemgrpctest.Harness{}, idemgrpctest.Features},
	"connect":      {idemconnecttest.Harness{Protocol: idemconnecttest.Connect}, idemconnecttest.Features},
	"connect-grpc": {idemconnecttest.Harness{Protocol: idemconnecttest.GRPC}, idemconnecttest.Features},
}

// TestConformanceSQLite gives each case a SQLite file of its own: SQLite
// runs one write transaction at a time.
func TestConformanceSQLite(t *testing.T) {
	for name, h := range harnesses {
		t.Run(name, func(t *testing.T) { idemfronttest.Exercise(t, h.h, h.f, frontstore.SQLite) })
	}
}

// TestConformancePostgres shares one schema between the cases, each
// under a tenant of its own.
func TestConformancePostgres(t *testing.T) {
	newStore := frontstore.Postgres(t, 4)
	for name, h := range harnesses {
		t.Run(name, func(t *testing.T) { idemfronttest.Exercise(t, h.h, h.f, newStore) })
	}
}
