package idemhttp_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// The tests in this file follow the table of docs/PROTOCOL.md, in order.

func TestMethodNotCoveredPassesThrough(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{}, c)
	for _, method := range []string{http.MethodGet, http.MethodPut, http.MethodDelete} {
		for range 2 {
			w := serve(h, request(method, "/orders", "k1", "x"))
			if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "" {
				t.Fatalf("%s: status %d replayed %q, want the handler's 201", method, w.Code, w.Header().Get(idemhttp.HeaderReplayed))
			}
		}
	}
	if got := c.n.Load(); got != 6 {
		t.Fatalf("handler ran %d times, want 6", got)
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("store holds %d records, want 0", n)
	}
}

func TestMethodsConfigured(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{Methods: []string{http.MethodPut}}, c)
	serve(h, request(http.MethodPut, "/orders", "k1", "x"))
	w := serve(h, request(http.MethodPut, "/orders", "k1", "x"))
	if w.Header().Get(idemhttp.HeaderReplayed) != "true" || c.n.Load() != 1 {
		t.Fatalf("PUT not protected: ran %d times", c.n.Load())
	}
	serve(h, request(http.MethodPost, "/orders", "k2", "x"))
	serve(h, request(http.MethodPost, "/orders", "k2", "x"))
	if c.n.Load() != 3 {
		t.Fatalf("POST protected although not configured: ran %d times, want 3", c.n.Load())
	}
}

func TestNoKeyPassesThrough(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{}, c)
	for range 2 {
		w := serve(h, request(http.MethodPost, "/orders", "", "x"))
		if w.Code != http.StatusCreated {
			t.Fatalf("status %d, want 201", w.Code)
		}
		if _, ok := w.Header()[idemhttp.HeaderKey]; ok {
			t.Fatal("a request without key got a key echoed")
		}
	}
	if c.n.Load() != 2 || e.store.Len() != 0 {
		t.Fatalf("ran %d times with %d records, want 2 and 0", c.n.Load(), e.store.Len())
	}
}

func TestNoKeyRequired(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{RequireKey: true}, c)
	w := serve(h, request(http.MethodPost, "/orders", "", "x"))
	wantProblem(t, w, http.StatusBadRequest, "key-required")
	if c.n.Load() != 0 || e.store.Len() != 0 {
		t.Fatalf("ran %d times with %d records, want 0 and 0", c.n.Load(), e.store.Len())
	}
	// Not covered methods still pass through.
	if w := serve(h, request(http.MethodGet, "/orders", "", "")); w.Code != http.StatusCreated {
		t.Fatalf("GET without key: status %d, want 201", w.Code)
	}
}

func TestMalformedKey(t *testing.T) {
	cases := map[string][]string{
		"empty":           {""},
		"blank":           {"   "},
		"too long":        {strings.Repeat("k", idem.MaxKeyLength+1)},
		"space inside":    {"a b"},
		"non-ASCII":       {"clé"},
		"control":         {"a\x01b"},
		"unterminated":    {`"abc`},
		"bad escape":      {`"a\b"`},
		"parameters":      {`"abc";v=1`},
		"empty string":    {`""`},
		"two fields":      {"abc", "abc"},
		"comma list":      {"abc, def"},
		"sf-string list":  {`"abc", "def"`},
		"too long quoted": {`"` + strings.Repeat("k", idem.MaxKeyLength+1) + `"`},
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil)
			c := &counting{}
			h := e.handler(t, idemhttp.Config{}, c)
			r := request(http.MethodPost, "/orders", "", "x")
			r.Header[idemhttp.HeaderKey] = values
			w := serve(h, r)
			wantProblem(t, w, http.StatusBadRequest, "invalid-key")
			if got := w.Header()[idemhttp.HeaderKey]; !slices.Equal(got, values) {
				t.Errorf("echoed %q, want the fields as sent, %q", got, values)
			}
			if c.n.Load() != 0 || e.store.Len() != 0 {
				t.Fatalf("ran %d times with %d records, want 0 and 0", c.n.Load(), e.store.Len())
			}
		})
	}
}

func TestKeyAbsentRunsAndStores(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{}, c)
	w := serve(h, request(http.MethodPost, "/orders?x=1", "k1", `{"qty":2}`))
	if w.Code != http.StatusCreated {
		t.Fatalf("status %d, want 201", w.Code)
	}
	wantEcho(t, w, "k1")
	if got, want := w.Body.String(), `{"execution":1,"request":"{\"qty\":2}"}`; got != want {
		t.Fatalf("body %s, want %s (the handler must read the body the middleware read)", got, want)
	}
	// The fresh answer is the handler's, whole: its cookie included.
	if w.Header().Get("Set-Cookie") == "" || w.Header().Get("X-Custom") == "" {
		t.Fatalf("fresh answer lost the handler's headers: %v", w.Header())
	}
	if w.Header().Get(idemhttp.HeaderReplayed) != "" {
		t.Fatal("a fresh answer is marked replayed")
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateComplete || rec.Result.Status != http.StatusCreated || !bytes.Equal(rec.Result.Body, w.Body.Bytes()) {
		t.Fatalf("stored %s %d %q, want complete 201 with the body sent", rec.State, rec.Result.Status, rec.Result.Body)
	}
	if _, ok := rec.Result.Header["Set-Cookie"]; ok {
		t.Fatal("Set-Cookie stored")
	}
	if got := rec.Result.Header["Location"]; len(got) != 1 || got[0] != "/orders/1" {
		t.Fatalf("stored Location %q", got)
	}
}

func TestReplaySameFingerprint(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{ReplayHeaders: []string{"x-custom"}}, c)
	first := serve(h, request(http.MethodPost, "/orders?b=2&a=1", "k1", "payload"))
	for range 3 {
		// Same request, query parameters in another order: same fingerprint.
		w := serve(h, request(http.MethodPost, "/orders?a=1&b=2", "k1", "payload"))
		if w.Code != first.Code || !bytes.Equal(w.Body.Bytes(), first.Body.Bytes()) {
			t.Fatalf("replay %d %q, want %d %q", w.Code, w.Body, first.Code, first.Body)
		}
		if w.Header().Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatal("replay not marked Idempotent-Replayed: true")
		}
		wantEcho(t, w, "k1")
		for _, name := range []string{"Content-Type", "Location", "X-Custom"} {
			if got, want := w.Header().Get(name), first.Header().Get(name); got != want {
				t.Fatalf("replayed %s = %q, want %q", name, got, want)
			}
		}
		if got := w.Header().Values("Set-Cookie"); len(got) != 0 {
			t.Fatalf("Set-Cookie replayed: %q", got)
		}
	}
	if c.n.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", c.n.Load())
	}
}

// The security headers a handler sets are replayed with its answer: a
// replayed page without them would be open to what they keep off.
func TestSecurityHeadersReplayed(t *testing.T) {
	e := newEnv(t, nil)
	security := map[string]string{
		"Content-Security-Policy":      "default-src 'self'",
		"X-Content-Type-Options":       "nosniff",
		"X-Frame-Options":              "DENY",
		"Strict-Transport-Security":    "max-age=63072000",
		"Referrer-Policy":              "no-referrer",
		"Permissions-Policy":           "camera=()",
		"Cross-Origin-Opener-Policy":   "same-origin",
		"Cross-Origin-Embedder-Policy": "require-corp",
		"Cross-Origin-Resource-Policy": "same-origin",
	}
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range security {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "<p>order created</p>")
	}))
	serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatal("not a replay")
	}
	for k, v := range security {
		if got := w.Header().Get(k); got != v {
			t.Errorf("replayed %s = %q, want %q", k, got, v)
		}
	}
}

func TestSetCookieNeverReplayed(t *testing.T) {
	e := newEnv(t, nil)
	for _, name := range []string{"Set-Cookie", "set-cookie", "Date", "Connection", "Transfer-Encoding"} {
		_, err := idemhttp.NewMiddleware(e.engine, &idemhttp.Config{TenantFunc: tenantOf, ReplayHeaders: []string{name}})
		if err == nil {
			t.Fatalf("New accepted ReplayHeaders %q", name)
		}
	}
	// A record stored by another program with a cookie in it: refused on
	// the way out too.
	h := e.handler(t, idemhttp.Config{}, &counting{})
	r := request(http.MethodPost, "/orders", "k1", "x")
	fp := idemhttp.Fingerprint(r, []byte("x"), nil)
	_, err := e.engine.Do(t.Context(), idem.Operation{Tenant: testTenant, Key: "k1", Fingerprint: fp}, func(context.Context) (idem.Result, error) {
		return idem.Result{Status: 200, Header: map[string][]string{"Set-Cookie": {"a=b"}, "Date": {"yesterday"}, "Etag": {`"v1"`}}, Body: []byte("ok")}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	w := serve(h, r)
	if w.Header().Get("Set-Cookie") != "" || w.Header().Get("Date") != "" || w.Header().Get("Etag") != `"v1"` {
		t.Fatalf("replayed headers %v, want the ETag only", w.Header())
	}
}

func TestFingerprintMismatch(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{FingerprintHeaders: []string{"X-Api-Version"}}, c)
	serve(h, request(http.MethodPost, "/orders", "k1", "payload"))
	other := map[string]*http.Request{
		"body":   request(http.MethodPost, "/orders", "k1", "payload2"),
		"path":   request(http.MethodPost, "/orders/2", "k1", "payload"),
		"query":  request(http.MethodPost, "/orders?x=1", "k1", "payload"),
		"method": request(http.MethodPatch, "/orders", "k1", "payload"),
		"header": request(http.MethodPost, "/orders", "k1", "payload"),
	}
	other["header"].Header.Set("X-Api-Version", "2")
	for name, r := range other {
		w := serve(h, r)
		wantProblem(t, w, http.StatusUnprocessableEntity, "fingerprint-mismatch")
		wantEcho(t, w, "k1")
		if c.n.Load() != 1 {
			t.Fatalf("%s: handler ran %d times, want 1", name, c.n.Load())
		}
	}
}

// blocking is a handler that signals when it starts and answers once
// released.
type blocking struct {
	started chan struct{}
	release chan struct{}
	n       atomic.Int64
	body    string
}

func newBlocking(body string) *blocking {
	return &blocking{started: make(chan struct{}, 16), release: make(chan struct{}), body: body}
}

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.n.Add(1)
	b.started <- struct{}{}
	select {
	case <-b.release:
	case <-r.Context().Done():
		return
	}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, b.body)
}

func TestInFlightDifferentFingerprint(t *testing.T) {
	e := newEnv(t, nil)
	b := newBlocking("first")
	h := e.handler(t, idemhttp.Config{}, b)
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	}()
	<-b.started
	w := serve(h, request(http.MethodPost, "/orders", "k1", "b"))
	wantProblem(t, w, http.StatusUnprocessableEntity, "fingerprint-mismatch")
	close(b.release)
	<-done
	if b.n.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", b.n.Load())
	}
}

func TestInFlightRetryAfter(t *testing.T) {
	for _, tc := range []struct {
		retryAfter time.Duration
		want       string
	}{
		{0, "1"}, // the default, 1s
		{1500 * time.Millisecond, "2"},
		{10 * time.Millisecond, "1"},
		{3 * time.Second, "3"},
	} {
		e := newEnv(t, nil)
		b := newBlocking("first")
		h := e.handler(t, idemhttp.Config{RetryAfter: tc.retryAfter}, b)
		done := make(chan struct{})
		go func() {
			defer close(done)
			serve(h, request(http.MethodPost, "/orders", "k1", "a"))
		}()
		<-b.started
		w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
		wantProblem(t, w, http.StatusConflict, "in-flight")
		wantEcho(t, w, "k1")
		if got := w.Header().Get("Retry-After"); got != tc.want {
			t.Fatalf("RetryAfter %v: Retry-After = %q, want %q", tc.retryAfter, got, tc.want)
		}
		close(b.release)
		<-done
		if b.n.Load() != 1 {
			t.Fatalf("handler ran %d times, want 1", b.n.Load())
		}
	}
}

func TestInFlightLeaseExpiredTakeover(t *testing.T) {
	e := newEnv(t, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
	var n atomic.Int64
	stuck, unstick := make(chan struct{}), make(chan struct{})
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			// The first execution hangs without answering, as a killed
			// process would: its lease is never extended nor released.
			close(stuck)
			<-unstick
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "second")
	}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	}()
	<-stuck
	// Within the lease: in flight.
	wantProblem(t, serve(h, request(http.MethodPost, "/orders", "k1", "a")), http.StatusConflict, "in-flight")
	e.clock.Advance(300 * time.Millisecond)
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if w.Code != http.StatusCreated || w.Body.String() != "second" {
		t.Fatalf("after the lease: %d %q, want the takeover's 201", w.Code, w.Body)
	}
	close(unstick)
	<-done
}

func TestRecordPastRetentionIsAbsent(t *testing.T) {
	e := newEnv(t, &idem.Config{Retention: time.Hour})
	c := &counting{}
	h := e.handler(t, idemhttp.Config{}, c)
	serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	e.clock.Advance(59 * time.Minute)
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatal("not replayed within retention")
	}
	e.clock.Advance(2 * time.Minute)
	// Past retention even a different request runs: the key is free.
	w := serve(h, request(http.MethodPost, "/orders", "k1", "b"))
	if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "" || c.n.Load() != 2 {
		t.Fatalf("past retention: %d replayed=%q, ran %d times; want a fresh 201, 2 runs", w.Code, w.Header().Get(idemhttp.HeaderReplayed), c.n.Load())
	}
}

// failingStore is the memory store with a claim that fails, as a store
// that cannot be reached does.
type failingStore struct {
	idem.Store
}

func (failingStore) Claim(context.Context, idem.ClaimParams) (idem.ClaimResult, error) {
	return idem.ClaimResult{}, errors.New("connection refused")
}

func TestStoreUnavailable(t *testing.T) {
	e := newEnv(t, nil)
	engine, err := idem.NewEngine(failingStore{e.store}, &idem.Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	c := &counting{}
	m, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOf, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	w := serve(m.Handler(c), request(http.MethodPost, "/orders", "k1", "a"))
	wantProblem(t, w, http.StatusServiceUnavailable, "store-unavailable")
	wantEcho(t, w, "k1")
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if c.n.Load() != 0 {
		t.Fatalf("handler ran %d times with the store down, want 0", c.n.Load())
	}
}

func TestHandlerStatusesStored(t *testing.T) {
	// 303 See Other after a creation is a result: stored like the others.
	for _, status := range []int{http.StatusOK, http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther, http.StatusBadRequest, http.StatusConflict, http.StatusUnprocessableEntity} {
		e := newEnv(t, nil)
		var n atomic.Int64
		h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			w.WriteHeader(status)
			io.WriteString(w, "answer")
		}))
		first := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
		second := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
		if first.Code != status || second.Code != status || second.Body.String() != "answer" || second.Header().Get(idemhttp.HeaderReplayed) != "true" || n.Load() != 1 {
			t.Fatalf("status %d: got %d then %d %q (replayed %q), ran %d times", status, first.Code, second.Code, second.Body, second.Header().Get(idemhttp.HeaderReplayed), n.Load())
		}
	}
}

func TestHandler5xxStoredAndReplayed(t *testing.T) {
	e := newEnv(t, nil)
	var n atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		http.Error(w, "payment provider down", http.StatusBadGateway)
	}))
	first := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	second := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if first.Code != http.StatusBadGateway || second.Code != http.StatusBadGateway || second.Header().Get(idemhttp.HeaderReplayed) != "true" || n.Load() != 1 {
		t.Fatalf("got %d then %d (replayed %q), ran %d times; want 502 stored and replayed", first.Code, second.Code, second.Header().Get(idemhttp.HeaderReplayed), n.Load())
	}
	if !bytes.Equal(first.Body.Bytes(), second.Body.Bytes()) {
		t.Fatalf("replay %q, want %q", second.Body, first.Body)
	}
}

func TestHandler5xxReleased(t *testing.T) {
	e := newEnv(t, nil)
	var n atomic.Int64
	h := e.handler(t, idemhttp.Config{ReleaseOn5xx: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			http.Error(w, "try again", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if first.Code != http.StatusServiceUnavailable || first.Body.String() != "try again\n" {
		t.Fatalf("first: %d %q, want the handler's 503", first.Code, first.Body)
	}
	wantEcho(t, first, "k1")
	e.wantAbsent(t, testTenant, "k1")
	second := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if second.Code != http.StatusCreated || n.Load() != 2 {
		t.Fatalf("retry: %d, ran %d times; want a fresh 201 from a second run", second.Code, n.Load())
	}
}

func TestHandlerPanics(t *testing.T) {
	e := newEnv(t, nil)
	var n atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.Header().Set("Set-Cookie", "half=done")
			w.WriteHeader(http.StatusCreated)
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	wantProblem(t, w, http.StatusInternalServerError, "handler-panic")
	wantEcho(t, w, "k1")
	if w.Header().Get("Set-Cookie") != "" {
		t.Fatal("the panicking handler's headers leaked into the problem")
	}
	// idemmem has no transaction: what the handler did before its panic
	// stands, so its key stays in flight until the lease ends.
	e.wantState(t, testTenant, "k1", idem.StateInFlight)
	if w := serve(h, request(http.MethodPost, "/orders", "k1", "a")); w.Code != http.StatusConflict || n.Load() != 1 {
		t.Fatalf("retry after panic: %d, ran %d times; want 409 and 1", w.Code, n.Load())
	}
}

func TestHandlerAbortRepanics(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Fatalf("recovered %v, want http.ErrAbortHandler", v)
			}
		}()
		serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	}()
	e.wantState(t, testTenant, "k1", idem.StateInFlight)
}

// With CancelOnDisconnect, a cancelled request cancels its handler.
func TestRequestCancelled(t *testing.T) {
	e := newEnv(t, nil)
	b := newBlocking("late")
	h := e.handler(t, idemhttp.Config{CancelOnDisconnect: true}, b)
	ctx, cancel := context.WithCancel(t.Context())
	var w *httptest.ResponseRecorder
	done := make(chan struct{})
	go func() {
		defer close(done)
		w = serve(h, request(http.MethodPost, "/orders", "k1", "a").WithContext(ctx))
	}()
	<-b.started
	cancel()
	<-done
	wantProblem(t, w, http.StatusInternalServerError, "request-cancelled")
	// idemmem has no transaction: the answer the handler gave after the
	// client left is stored for its retry rather than run again.
	e.wantState(t, testTenant, "k1", idem.StateComplete)
}

// A handler that writes its answer although the request was cancelled
// meanwhile: on a store without transactions the answer is stored, since
// a retry would repeat the handler's effects.
func TestRequestCancelledHandlerAnswers(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithCancel(t.Context())
	h := e.handler(t, idemhttp.Config{CancelOnDisconnect: true}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel()
		w.WriteHeader(http.StatusCreated)
	}))
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a").WithContext(ctx))
	wantProblem(t, w, http.StatusInternalServerError, "request-cancelled")
	e.wantState(t, testTenant, "k1", idem.StateComplete)
}

func TestTenantError(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{TenantFunc: func(r *http.Request) (string, error) {
		return "", errors.New("no identity")
	}}, c)
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	wantProblem(t, w, http.StatusUnauthorized, "unauthenticated")
	if c.n.Load() != 0 || e.store.Len() != 0 {
		t.Fatalf("ran %d times with %d records, want 0 and 0", c.n.Load(), e.store.Len())
	}
}

func TestRequestBodyTooLarge(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{MaxRequestBody: 16}, c)
	// Exactly at the limit: accepted.
	if w := serve(h, request(http.MethodPost, "/orders", "k0", strings.Repeat("x", 16))); w.Code != http.StatusCreated {
		t.Fatalf("body at the limit: %d, want 201", w.Code)
	}
	// Announced too long: refused before a byte is read.
	announced := &countingReader{r: strings.NewReader(strings.Repeat("x", 17))}
	r1 := request(http.MethodPost, "/orders", "k1", "")
	r1.Body, r1.ContentLength = io.NopCloser(announced), 17
	w := serve(h, r1)
	wantProblem(t, w, http.StatusRequestEntityTooLarge, "request-too-large")
	wantEcho(t, w, "k1")
	if announced.n != 0 {
		t.Fatalf("read %d bytes of a body announced too long", announced.n)
	}
	// Unannounced (chunked) and too long.
	r := request(http.MethodPost, "/orders", "k2", "")
	r.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", 1000)))
	r.ContentLength = -1
	wantProblem(t, serve(h, r), http.StatusRequestEntityTooLarge, "request-too-large")
	if c.n.Load() != 1 || e.store.Len() != 1 {
		t.Fatalf("ran %d times with %d records, want 1 and 1", c.n.Load(), e.store.Len())
	}
}

func TestResponseTooLarge(t *testing.T) {
	e := newEnv(t, nil)
	var n atomic.Int64
	var writeErr error
	h := e.handler(t, idemhttp.Config{MaxResponseBody: 100}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, writeErr = w.Write(bytes.Repeat([]byte("x"), 101))
	}))
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	wantProblem(t, w, http.StatusInternalServerError, "response-too-large")
	if !errors.Is(writeErr, idemhttp.ErrResponseTooLarge) {
		t.Fatalf("Write returned %v, want ErrResponseTooLarge", writeErr)
	}
	// Neither sent unstored nor stored truncated: released.
	e.wantAbsent(t, testTenant, "k1")
	serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if n.Load() != 2 {
		t.Fatalf("ran %d times, want 2", n.Load())
	}
}

func TestUnreadableBody(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{}, c)
	r := request(http.MethodPost, "/orders", "k1", "")
	r.Body = io.NopCloser(io.MultiReader(strings.NewReader("abc"), errReader{}))
	wantProblem(t, serve(h, r), http.StatusBadRequest, "request-unreadable")
	if c.n.Load() != 0 || e.store.Len() != 0 {
		t.Fatalf("ran %d times with %d records, want 0 and 0", c.n.Load(), e.store.Len())
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestNewRefusesBadConfig(t *testing.T) {
	e := newEnv(t, nil)
	for name, cfg := range map[string]idemhttp.Config{
		"reference, no replay":  {TenantFunc: tenantOf, Mode: idem.ModeReference},
		"marker, no replay":     {TenantFunc: tenantOf, Mode: idem.ModeMarker},
		"unknown mode":          {TenantFunc: tenantOf, Mode: 42},
		"cookie in replay list": {TenantFunc: tenantOf, ReplayHeaders: []string{"Set-Cookie"}},
		"no tenant rule":        {},
		"two tenant rules":      {TenantFunc: tenantOf, SharedKeySpace: true},
		"unstored 1xx":          {TenantFunc: tenantOf, UnstoredStatuses: []int{103}},
	} {
		if _, err := idemhttp.NewMiddleware(e.engine, &cfg); err == nil {
			t.Errorf("%s: NewMiddleware accepted the config", name)
		}
	}
	if _, err := idemhttp.NewMiddleware(nil, &idemhttp.Config{TenantFunc: tenantOf}); err == nil {
		t.Error("NewMiddleware accepted a nil engine")
	}
	if _, err := idemhttp.NewMiddleware(e.engine, nil); err == nil {
		t.Error("NewMiddleware accepted a nil config")
	}
}

// A request whose handler already completed is replayed even when the
// handler sets headers through outer middlewares: the outer headers stay.
func TestOuterHeadersKept(t *testing.T) {
	e := newEnv(t, nil)
	inner := e.handler(t, idemhttp.Config{}, &counting{})
	outer := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Request-Id", "req-1")
		inner.ServeHTTP(w, r)
	})
	for i := range 2 {
		w := serve(outer, request(http.MethodPost, "/orders", "k1", "a"))
		if w.Header().Get("X-Request-Id") != "req-1" {
			t.Fatalf("answer %d lost the outer header: %v", i, w.Header())
		}
	}
}

// By default a client that goes away does not end the execution: the
// handler runs on a context its request's end does not cancel, its answer
// is stored, and the retry gets the replay instead of running the
// operation a second time.
func TestDisconnectFinishesByDefault(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		close(started)
		<-release
		if err := r.Context().Err(); err != nil {
			http.Error(w, "cancelled: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "finished")
	}))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		serve(h, request(http.MethodPost, "/orders", "k1", "a").WithContext(ctx))
	}()
	<-started
	cancel()
	close(release)
	<-done
	e.wantState(t, testTenant, "k1", idem.StateComplete)
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if w.Code != http.StatusCreated || w.Body.String() != "finished" || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("retry got %d %q replayed=%q, want the stored 201", w.Code, w.Body.String(), w.Header().Get(idemhttp.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
}
