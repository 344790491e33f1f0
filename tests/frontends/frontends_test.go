// Package frontends runs the front-end suite against the framework
// adapters (idemgin, idemecho, idemfiber) on transactional stores:
// SQLite and PostgreSQL, the handler's writes committing with its answer
// and rolling back with its failures. A module of its own, so that the
// frameworks reach no other test module.
package frontends

import (
	"testing"

	"github.com/idem-go/idem/idemecho/idemechotest"
	"github.com/idem-go/idem/idemfiber/idemfibertest"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgin/idemgintest"
	"github.com/idem-go/idem/tests/internal/frontstore"
)

// frontEnds are the adapters under test, with what each cannot do.
var frontEnds = []struct {
	name     string
	harness  idemfronttest.Harness
	features idemfronttest.Features
}{
	{"gin", idemgintest.Harness, idemfronttest.Features{}},
	{"echo", idemechotest.Harness, idemfronttest.Features{}},
	{"fiber", idemfibertest.Harness{}, idemfibertest.Features},
}

// TestConformanceSQLite gives each case a SQLite file of its own: SQLite
// runs one write transaction at a time, and a case's handler may hold
// one while another case claims.
func TestConformanceSQLite(t *testing.T) {
	for _, fe := range frontEnds {
		t.Run(fe.name, func(t *testing.T) {
			idemfronttest.Exercise(t, fe.harness, fe.features, frontstore.SQLite)
		})
	}
}

// TestConformancePostgres shares one schema between the cases of a front
// end, each under a tenant of its own, as a deployment shares one
// database.
func TestConformancePostgres(t *testing.T) {
	for _, fe := range frontEnds {
		t.Run(fe.name, func(t *testing.T) {
			idemfronttest.Exercise(t, fe.harness, fe.features, frontstore.Postgres(t, 8))
		})
	}
}
