package idemgin_test

import (
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgin/idemgintest"
)

func init() { gin.SetMode(gin.TestMode) }

// TestConformance runs the front-end suite against idemgin over a real
// gin.Engine on loopback, on idemmem; tests/frontends runs it on SQLite
// and PostgreSQL.
func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, idemgintest.Harness, idemfronttest.Features{}, nil)
}
