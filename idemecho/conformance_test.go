package idemecho_test

import (
	"testing"

	"github.com/idem-go/idem/idemecho/idemechotest"
	"github.com/idem-go/idem/idemfronttest"
)

// TestConformance runs the front-end suite against idemecho over a real
// echo.Echo on loopback, on idemmem; tests/frontends runs it on SQLite
// and PostgreSQL.
func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, idemechotest.Harness, idemfronttest.Features{}, nil)
}
