package idemfiber_test

import (
	"testing"

	"github.com/idem-go/idem/idemfiber/idemfibertest"
	"github.com/idem-go/idem/idemfronttest"
)

// TestConformance runs the front-end suite against idemfiber over a real
// fiber.App on loopback, on idemmem; tests/frontends runs it on SQLite
// and PostgreSQL.
func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, idemfibertest.Harness{}, idemfibertest.Features, nil)
}
