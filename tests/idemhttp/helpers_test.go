package idemhttp_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idem-go/idem/internal/httpcheck"
)

// quietLogger drops the middleware's logs: the tests provoke failures on
// purpose.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// The requests of the tests, and their tenant (see httpcheck).
const testTenant = httpcheck.TestTenant

var (
	tenantOf = httpcheck.TenantOf
	request  = httpcheck.Request
	serve    = httpcheck.Serve
)

// wantProblem checks that an answer is the problem slug with status.
var wantProblem = httpcheck.WantProblem

// retryWhileInFlight sends the request until it is no longer answered 409
// in-flight.
func retryWhileInFlight(t *testing.T, h http.Handler, req func() *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w := serve(h, req())
		if w.Code != http.StatusConflict {
			return w
		}
		wantProblem(t, w, http.StatusConflict, "in-flight")
		if time.Now().After(deadline) {
			t.Fatal("still in flight after 10s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
