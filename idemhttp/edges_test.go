package idemhttp_test

import (
	"io"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Limits at math.MaxInt64, a natural "no limit", do not overflow: a body
// of unknown length is read, an answer copied through io.Copy is stored,
// and both replay.
func TestLimitsAtMaxInt64(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{MaxRequestBody: math.MaxInt64, MaxResponseBody: math.MaxInt64},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			// A reader without WriteTo: io.Copy goes through ReadFrom.
			_, _ = io.Copy(w, io.LimitReader(strings.NewReader("order for "+string(body)), 1<<20))
		}))
	send := func() (int, string) {
		r := request(http.MethodPost, "/orders", "k1", "")
		r.Body = io.NopCloser(strings.NewReader("tea"))
		r.ContentLength = -1 // unknown length, as with chunked encoding
		w := serve(h, r)
		return w.Code, w.Body.String()
	}
	if code, body := send(); code != http.StatusCreated || body != "order for tea" {
		t.Fatalf("first: %d %q", code, body)
	}
	if code, body := send(); code != http.StatusCreated || body != "order for tea" {
		t.Fatalf("replay: %d %q", code, body)
	}
}

// A ReplayFunc that panics before writing answers 500 replay-failed,
// instead of a dropped connection on every retry of a completed key.
func TestReplayFuncPanic(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{
		Mode: idem.ModeReference,
		ReplayFunc: func(http.ResponseWriter, *http.Request, idem.Result) {
			panic("the order is gone")
		},
	}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		idemhttp.SetReference(r.Context(), "ord_1")
		w.WriteHeader(http.StatusCreated)
	}))
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	wantProblem(t, serve(h, request(http.MethodPost, "/orders", "k1", "a")), http.StatusInternalServerError, "replay-failed")
}

// A replayed header the handler wrote into the map under a non-canonical
// name (h["ETag"]) is replayed too; a ReplayHeaders name that is not a
// header name is refused by New.
func TestNonCanonicalReplayHeader(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header()["ETag"] = []string{`"v1"`}
		w.WriteHeader(http.StatusCreated)
	}))
	serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	again := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if again.Header().Get(idemhttp.HeaderReplayed) != "true" || again.Header().Get("Etag") != `"v1"` {
		t.Fatalf("replay headers %v, want the ETag", again.Header())
	}
	if _, err := idemhttp.NewMiddleware(e.engine, &idemhttp.Config{TenantFunc: tenantOf, ReplayHeaders: []string{"X Foo"}}); err == nil {
		t.Fatal("New accepted the header name \"X Foo\"")
	}
}
