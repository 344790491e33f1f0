// Package idemgintest runs the front-end conformance suite
// (idemfronttest) against idemgin, over a real gin.Engine on loopback:
//
//	idemfronttest.Exercise(t, idemgintest.Harness, idemfronttest.Features{}, nil)
package idemgintest

import (
	"net/http"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgin"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// Harness is idemfronttest.Harness for idemgin: idemhttptest's HTTP
// harness serving a gin.Engine whose route runs idemgin's middleware,
// then the suite's handler as the route's last handler.
var Harness = idemhttptest.Harness{Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
	gin.SetMode(gin.TestMode)
	mw, err := idemgin.New(engine, &idemgin.Config{HTTP: *cfg})
	if err != nil {
		t.Fatal(err)
	}
	r := gin.New()
	r.POST("/orders", mw, gin.WrapH(protected))
	return r
}}
