package idemgin_test

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgin"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

func init() { gin.SetMode(gin.TestMode) }

// Harness is the front-end suite's harness over a real gin.Engine served
// on loopback: the suite's handler is the Gin route's last handler,
// behind idemgin's middleware. tests/frontends runs it on SQLite and
// PostgreSQL.
var Harness = idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
	mw, err := idemgin.New(engine, &idemgin.Config{HTTP: *cfg})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/orders", mw, gin.WrapH(protected))
	return r
}}

func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, Harness, idemfronttest.Features{}, nil)
}
