package idemhttp_test

import (
	"net/http"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemhttp/idemhttptest"
)

// TestConformanceWithOptions runs the front-end suite against a route
// derived with Middleware.With, under the canonical-JSON fingerprint and
// a replay hook: the options change what counts as the same request and
// who serves a route, never the contract.
func TestConformanceWithOptions(t *testing.T) {
	h := idemhttptest.Harness{
		Config: idemhttp.Config{
			CanonicalJSON: true,
			IgnoreJSON:    []string{"/sent_at"},
			OnReplay:      func(r *http.Request, res idem.Result, h http.Header) { h.Set("X-Replay-Seen", "1") },
		},
		Server: func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler {
			base, err := idemhttp.NewMiddleware(engine, cfg)
			if err != nil {
				t.Fatal(err)
			}
			route, err := base.With(base.Policy())
			if err != nil {
				t.Fatal(err)
			}
			return route.Handler(protected)
		},
	}
	idemfronttest.Exercise(t, h, idemfronttest.Features{}, nil)
}
