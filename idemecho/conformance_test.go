package idemecho_test

import (
	"net/http"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemecho"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
	"github.com/labstack/echo/v4"
)

// Harness is the front-end suite's harness over a real echo.Echo served
// on loopback: the suite's handler is the Echo route's handler, behind
// idemecho's middleware. tests/frontends runs it on SQLite and
// PostgreSQL.
var Harness = idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
	mw, err := idemecho.IdempotencyConfig{Engine: engine, HTTP: *cfg}.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.POST("/orders", echo.WrapHandler(protected), mw)
	return e
}}

func TestConformance(t *testing.T) {
	idemfronttest.Exercise(t, Harness, idemfronttest.Features{}, nil)
}
