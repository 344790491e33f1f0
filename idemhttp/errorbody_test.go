package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/atonce"
)

// An error body larger than MaxStoredErrorBody (an error that quotes the
// request, whose size the caller chooses) is sent whole to the first
// client but not stored: a problem that says so is stored in its place,
// with the original status, and the operation never runs again.
func TestLargeErrorBodyNotStored(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		var in bytes.Buffer
		in.ReadFrom(r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Language", "en")
		w.Header().Set("Retry-After", "7")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.WriteHeader(http.StatusConflict)
		w.Write([]byte("invalid order: "))
		w.Write(in.Bytes())
	}))
	quoted := strings.Repeat("x", idemhttp.DefaultMaxStoredErrorBody)
	first := serve(h, request(http.MethodPost, "/orders", "k1", quoted))
	if first.Code != http.StatusConflict || first.Body.String() != "invalid order: "+quoted {
		t.Fatalf("first: %d, %d bytes; want the whole 409", first.Code, first.Body.Len())
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil || int64(len(rec.Result.Body)) > idemhttp.DefaultMaxStoredErrorBody {
		t.Fatalf("stored %d bytes, %v; want at most %d", len(rec.Result.Body), err, idemhttp.DefaultMaxStoredErrorBody)
	}
	replay := serve(h, request(http.MethodPost, "/orders", "k1", quoted))
	wantProblem(t, replay, http.StatusConflict, "error-body-not-stored")
	if replay.Header().Get(idemhttp.HeaderReplayed) != "true" || replay.Header().Get("Content-Language") != "" || replay.Header().Get("Retry-After") != "7" {
		t.Fatalf("replay headers %v: want replayed, without the original body's Content-Language, with its Retry-After", replay.Header())
	}
	var p problemBody
	json.Unmarshal(replay.Body.Bytes(), &p)
	if !strings.Contains(p.Detail, "409") || !strings.Contains(p.Detail, "8207 bytes") {
		t.Fatalf("detail %q does not give the status and size of the original", p.Detail)
	}
	if runs.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", runs.Load())
	}

	// At the limit, and for a success, the body is stored whole.
	small := strings.Repeat("y", idemhttp.DefaultMaxStoredErrorBody-len("invalid order: "))
	serve(h, request(http.MethodPost, "/orders", "k2", small))
	if w := serve(h, request(http.MethodPost, "/orders", "k2", small)); w.Code != http.StatusConflict || w.Body.String() != "invalid order: "+small {
		t.Fatalf("error at the limit replayed as %d, %d bytes", w.Code, w.Body.Len())
	}
	ok := e.handler(t, idemhttp.Config{}, &counting{})
	serve(ok, request(http.MethodPost, "/orders", "k3", quoted))
	if w := serve(ok, request(http.MethodPost, "/orders", "k3", quoted)); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), quoted) {
		t.Fatalf("a large success replayed as %d, %d bytes", w.Code, w.Body.Len())
	}
}

// Duplicates at the same instant of a request whose error body is too
// large to store: the handler runs once; the others get 409 in flight or
// the stored problem with the original status.
func TestLargeErrorBodyDuplicatesAtOnce(t *testing.T) {
	const n = 30
	e := newEnv(t, nil)
	var runs atomic.Int64
	big := strings.Repeat("e", 2*idemhttp.DefaultMaxStoredErrorBody)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		http.Error(w, big, http.StatusUnprocessableEntity)
	}))
	answers := make([]*httptest.ResponseRecorder, n)
	atonce.Run(n, func(i int) { answers[i] = serve(h, request(http.MethodPost, "/orders", "k1", "a")) })
	fresh := 0
	for i, w := range answers {
		switch {
		case w.Code == http.StatusConflict:
			wantProblem(t, w, http.StatusConflict, "in-flight")
		case w.Header().Get(idemhttp.HeaderReplayed) == "true":
			wantProblem(t, w, http.StatusUnprocessableEntity, "error-body-not-stored")
		case w.Code == http.StatusUnprocessableEntity && w.Body.String() == big+"\n":
			fresh++
		default:
			t.Fatalf("answer %d: %d, %d bytes", i, w.Code, w.Body.Len())
		}
	}
	if runs.Load() != 1 || fresh != 1 {
		t.Fatalf("ran %d times, %d fresh answers; want 1 and 1", runs.Load(), fresh)
	}
}
