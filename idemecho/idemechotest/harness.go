// Package idemechotest runs the front-end conformance suite
// (idemfronttest) against idemecho, over a real echo.Echo on loopback:
//
//	idemfronttest.Exercise(t, idemechotest.Harness, idemfronttest.Features{}, nil)
package idemechotest

import (
	"net/http"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemecho"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
	"github.com/labstack/echo/v4"
)

// Harness is idemfronttest.Harness for idemecho: idemhttptest's HTTP
// harness serving an echo.Echo whose route runs the suite's handler
// behind idemecho's middleware.
var Harness = idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
	mw, err := idemecho.IdempotencyConfig{Engine: engine, HTTP: *cfg}.ToMiddleware()
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.POST("/orders", echo.WrapHandler(protected), mw)
	return e
}}
