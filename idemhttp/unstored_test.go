package idemhttp_test

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/atonce"
)

// A handler that marks its answer with idem.NotExecuted (it refused the
// request before any work) gets it sent, nothing stored, and the key
// released: the corrected retry runs.
func TestNotExecutedAnswerNotStored(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			idem.NotExecuted(r.Context())
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"title":"amount missing"}`)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if first.Code != http.StatusBadRequest || first.Body.String() != `{"title":"amount missing"}` {
		t.Fatalf("first: %d %q, want the handler's 400", first.Code, first.Body)
	}
	wantEcho(t, first, "k1")
	e.wantAbsent(t, testTenant, "k1")
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("retry: %d, ran %d times; want a fresh 201", w.Code, runs.Load())
	}
}

// What a router answers for a path or a method it does not serve, its
// redirects, and a limit reached downstream, are no result: sent, not
// stored, the key released.
func TestRoutingAnswersNotStored(t *testing.T) {
	e := newEnv(t, nil)
	var orders atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		orders.Add(1)
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("GET /invoices", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("POST /old", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/orders", http.StatusPermanentRedirect)
	})
	mux.HandleFunc("POST /temp", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/orders", http.StatusTemporaryRedirect)
	})
	mux.HandleFunc("POST /busy", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "provider rate limit", http.StatusTooManyRequests)
	})
	h := e.handler(t, idemhttp.Config{}, mux)
	for path, want := range map[string]int{
		"/order":    http.StatusNotFound,
		"/invoices": http.StatusMethodNotAllowed,
		"/old":      http.StatusPermanentRedirect,
		"/temp":     http.StatusTemporaryRedirect,
		"/busy":     http.StatusTooManyRequests,
	} {
		key := "key" + path
		for i := range 2 {
			w := serve(h, request(http.MethodPost, path, key, "a"))
			if w.Code != want || w.Header().Get(idemhttp.HeaderReplayed) != "" {
				t.Fatalf("%s, answer %d: %d replayed=%q, want a fresh %d", path, i, w.Code, w.Header().Get(idemhttp.HeaderReplayed), want)
			}
			wantEcho(t, w, key)
		}
		e.wantAbsent(t, testTenant, key)
		// The key is free: the request sent where it belongs runs.
		if w := serve(h, request(http.MethodPost, "/orders", key, "a")); w.Code != http.StatusCreated {
			t.Fatalf("%s then /orders with the key: %d", path, w.Code)
		}
	}
	if orders.Load() != 5 {
		t.Fatalf("%d orders, want 5", orders.Load())
	}
}

// The set is configurable; an empty one stores every status.
func TestUnstoredStatusesConfigured(t *testing.T) {
	for _, tc := range []struct {
		name     string
		unstored []int
		status   int
		stored   bool
	}{
		{"default, 404", nil, http.StatusNotFound, false},
		{"default, 409", nil, http.StatusConflict, true},
		{"default, 303", nil, http.StatusSeeOther, true},
		{"empty set, 404", []int{}, http.StatusNotFound, true},
		{"own set, 409", []int{http.StatusConflict}, http.StatusConflict, false},
		{"own set, 404", []int{http.StatusConflict}, http.StatusNotFound, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			h := e.handler(t, idemhttp.Config{UnstoredStatuses: tc.unstored}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
			}))
			if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code != tc.status {
				t.Fatalf("status %d, want %d", w.Code, tc.status)
			}
			if tc.stored {
				e.wantState(t, testTenant, "k1", idem.StateComplete)
			} else {
				e.wantAbsent(t, testTenant, "k1")
			}
		})
	}
}

// The request's media type is part of the fingerprint: the same bytes as
// JSON and as a form are two requests; its case and parameters are not.
func TestMediaTypeFingerprinted(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{}, c)
	send := func(h http.Handler, key, contentType string) int {
		r := request(http.MethodPost, "/orders", key, "a=1")
		if contentType != "" {
			r.Header.Set("Content-Type", contentType)
		}
		return serve(h, r).Code
	}
	send(h, "k1", "application/json")
	for _, same := range []string{"application/json", "Application/JSON; charset=utf-8", " application/json ;q=1"} {
		if code := send(h, "k1", same); code != http.StatusCreated {
			t.Errorf("Content-Type %q: %d, want the replay", same, code)
		}
	}
	for _, other := range []string{"application/x-www-form-urlencoded", "text/plain", ""} {
		if code := send(h, "k1", other); code != http.StatusUnprocessableEntity {
			t.Errorf("Content-Type %q: %d, want 422", other, code)
		}
	}
	if c.n.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", c.n.Load())
	}

	// IgnoreMediaType leaves it out.
	ignoring := e.handler(t, idemhttp.Config{IgnoreMediaType: true}, c)
	send(ignoring, "k2", "application/json")
	if code := send(ignoring, "k2", "application/x-www-form-urlencoded"); code != http.StatusCreated || c.n.Load() != 2 {
		t.Fatalf("IgnoreMediaType: %d, ran %d times; want the replay", code, c.n.Load())
	}
}

// A keyed request whose method the middleware does not cover passes
// through without the key echo, as documented.
func TestUncoveredMethodNoEcho(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{}, &counting{})
	w := serve(h, request(http.MethodPut, "/orders", "k1", "a"))
	if _, ok := w.Header()[idemhttp.HeaderKey]; ok {
		t.Fatalf("an uncovered PUT echoed the key: %v", w.Header())
	}
}

// Duplicates at the same instant of a request the endpoint does not
// execute: each gets the handler's answer or 409 in flight, never a
// replay, and nothing is left stored.
func TestUnstoredAnswerDuplicatesAtOnce(t *testing.T) {
	const n = 30
	e := newEnv(t, nil)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		http.NotFound(w, r)
	}))
	codes := make([]int, n)
	replayed := make([]string, n)
	atonce.Run(n, func(i int) {
		w := serve(h, request(http.MethodPost, "/nowhere", "k1", "a"))
		codes[i], replayed[i] = w.Code, w.Header().Get(idemhttp.HeaderReplayed)
	})
	for i := range n {
		if codes[i] != http.StatusNotFound && codes[i] != http.StatusConflict || replayed[i] != "" {
			t.Fatalf("answer %d: %d replayed=%q, want 404 or 409, never a replay", i, codes[i], replayed[i])
		}
	}
	if runs.Load() < 1 {
		t.Fatal("the handler never ran")
	}
	e.wantAbsent(t, testTenant, "k1")
}
