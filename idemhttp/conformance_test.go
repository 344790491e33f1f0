package idemhttp_test

import (
	"testing"

	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// TestConformance runs the front-end suite against the middleware over
// idemmem; tests/idemhttp runs it on SQLite and PostgreSQL.
func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, idemhttptest.Harness{}, idemfronttest.Features{}, nil)
}
