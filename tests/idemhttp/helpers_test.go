package idemhttp_test

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// quietLogger drops the middleware's logs: the tests provoke failures on
// purpose.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// testTenant is the tenant of the requests built by request: the caller
// its Authorization header authenticates.
const testTenant = "acme"

// tenantOf stands for what an authentication middleware in front leaves
// for TenantFunc: here the tenant is the bearer token itself.
func tenantOf(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return "", errors.New("not authenticated")
	}
	return token, nil
}

// as makes r a request of tenant.
func as(tenant string, r *http.Request) *http.Request {
	r.Header.Set("Authorization", "Bearer "+tenant)
	return r
}

// request builds a request of testTenant; key "" means no
// Idempotency-Key field.
func request(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	return as(testTenant, r)
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// problemBody is the decoded RFC 9457 answer.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// wantProblem checks that w is the problem slug with status.
func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, slug string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != idemhttp.ContentTypeProblem {
		t.Fatalf("Content-Type = %q, want %q", ct, idemhttp.ContentTypeProblem)
	}
	var p problemBody
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", w.Body, err)
	}
	if want := idemhttp.ProblemTypeBase + slug; p.Type != want {
		t.Fatalf("problem type = %q, want %q", p.Type, want)
	}
	if p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem = %+v, want status %d with title and detail", p, status)
	}
}

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
