// Package httpcheck holds the HTTP test helpers that several modules'
// tests share: a client call as a caller of a router adapter makes it
// (idemecho, idemgin), the recorder-side request and problem checks of
// idemhttp's tests (in the core module and in tests/idemhttp), and the
// two-instance race of the stores' HTTP tests (idemredis, idemdynamo).
// It is internal: only tests import it.
package httpcheck

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// Answer is what a server answered one call.
type Answer struct {
	Status int
	Header http.Header
	Body   string
}

// Post sends body to srv's path, as user (a bearer token; "" for no
// Authorization field) and with key as its Idempotency-Key ("" for none),
// and reads the whole answer.
func Post(t testing.TB, srv *httptest.Server, path, user, key, body string) Answer {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if user != "" {
		req.Header.Set("Authorization", "Bearer "+user)
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	return Answer{resp.StatusCode, resp.Header, string(b)}
}

// TestTenant is the tenant of the requests Request builds: the caller
// its Authorization header authenticates.
const TestTenant = "acme"

// TenantOf stands for what an authentication middleware in front leaves
// for TenantFunc: here the tenant is the bearer token itself.
func TenantOf(r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		return "", errors.New("not authenticated")
	}
	return token, nil
}

// As makes r a request of tenant.
func As(tenant string, r *http.Request) *http.Request {
	r.Header.Set("Authorization", "Bearer "+tenant)
	return r
}

// Request builds a request of TestTenant; key "" means no
// Idempotency-Key field.
func Request(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	return As(TestTenant, r)
}

// Serve runs r through h and returns what h wrote.
func Serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// Problem is the decoded RFC 9457 answer.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// WantProblem checks that w is the problem slug with status, with a title
// and a detail.
func WantProblem(t testing.TB, w *httptest.ResponseRecorder, status int, slug string) {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status = %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != idemhttp.ContentTypeProblem {
		t.Fatalf("Content-Type = %q, want %q", ct, idemhttp.ContentTypeProblem)
	}
	var p Problem
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
