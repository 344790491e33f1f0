package idemhttp_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/atonce"
)

// keyedBy builds a request of testTenant whose key is in header name.
func keyedBy(name, key, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
	r.Header.Set(name, key)
	return as(testTenant, r)
}

// TestKeyHeaderAtOneBarrier: requests that carry their key in
// X-Idempotency-Key, released together, run the handler once under
// Config.KeyHeader; without it they carry no key the middleware knows and
// every one of them runs.
func TestKeyHeaderAtOneBarrier(t *testing.T) {
	const n = 20
	for _, tc := range []struct {
		name     string
		header   string
		wantRuns int64
	}{
		{"default Idempotency-Key", "", n},
		{"KeyHeader X-Idempotency-Key", "X-Idempotency-Key", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			var runs atomic.Int64
			release := make(chan struct{})
			h := e.handler(t, idemhttp.Config{KeyHeader: tc.header}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					<-release // the others meet the key in flight
				}
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, "created")
			}))
			answers := make([]*httptest.ResponseRecorder, n)
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- serve(h, keyedBy("X-Idempotency-Key", "k1", "a")) }()
			waitFor(t, "the first execution", func() bool { return runs.Load() >= 1 })
			atonce.Run(n-1, func(i int) { answers[i] = serve(h, keyedBy("X-Idempotency-Key", "k1", "a")) })
			close(release)
			answers[n-1] = <-first
			if got := runs.Load(); got != tc.wantRuns {
				t.Fatalf("handler ran %d times, want %d", got, tc.wantRuns)
			}
			if tc.header == "" {
				return
			}
			var conflicts int
			for i, w := range answers {
				if got := w.Header().Get("X-Idempotency-Key"); got != "k1" {
					t.Fatalf("answer %d echoes X-Idempotency-Key %q, want k1", i, got)
				}
				if w.Header()[idemhttp.HeaderKey] != nil {
					t.Fatalf("answer %d echoes %s, which the request did not carry", i, idemhttp.HeaderKey)
				}
				if w.Code == http.StatusConflict {
					conflicts++
					wantProblem(t, w, http.StatusConflict, "in-flight")
				}
			}
			if conflicts != n-1 {
				t.Fatalf("%d answers 409, want %d", conflicts, n-1)
			}
			w := serve(h, keyedBy("x-idempotency-key", "k1", "a"))
			if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
				t.Fatalf("retry: %d replayed=%q, want the replayed 201", w.Code, w.Header().Get(idemhttp.HeaderReplayed))
			}
			// The custom field follows ParseKey's rules.
			r := keyedBy("X-Idempotency-Key", "a", "a")
			r.Header.Add("X-Idempotency-Key", "b")
			w = serve(h, r)
			wantProblem(t, w, http.StatusBadRequest, "invalid-key")
			if !strings.Contains(w.Body.String(), "X-Idempotency-Key field") {
				t.Fatalf("invalid-key problem %s does not name the key's field", w.Body)
			}
			// Idempotency-Key is no longer the key's field.
			if w := serve(h, keyedBy(idemhttp.HeaderKey, "k1", "a")); w.Header().Get(idemhttp.HeaderReplayed) != "" || w.Code != http.StatusCreated {
				t.Fatalf("a request keyed by Idempotency-Key: %d replayed=%q, want a pass-through 201", w.Code, w.Header().Get(idemhttp.HeaderReplayed))
			}
		})
	}
}

// TestKeyFunc: a key read from a query parameter protects the request; an
// error from KeyFunc and a key idem refuses answer 400 invalid-key; ""
// passes the request through.
func TestKeyFunc(t *testing.T) {
	e := newEnv(t, nil)
	c := &counting{}
	h := e.handler(t, idemhttp.Config{KeyFunc: func(r *http.Request) (string, error) {
		q := r.URL.Query()
		if len(q["op"]) > 1 {
			return "", errors.New("two op parameters")
		}
		return q.Get("op"), nil
	}}, c)
	post := func(target string) *httptest.ResponseRecorder {
		return serve(h, as(testTenant, httptest.NewRequest(http.MethodPost, target, strings.NewReader("a"))))
	}
	w1 := post("/orders?op=k1")
	w2 := post("/orders?op=k1")
	if w1.Code != http.StatusCreated || w2.Header().Get(idemhttp.HeaderReplayed) != "true" || w1.Body.String() != w2.Body.String() {
		t.Fatalf("first %d %q, retry %d %q replayed=%q: want the first answer replayed", w1.Code, w1.Body, w2.Code, w2.Body, w2.Header().Get(idemhttp.HeaderReplayed))
	}
	if v, ok := w1.Header()[idemhttp.HeaderKey]; ok {
		t.Fatalf("a key from KeyFunc echoed as %s: %q", idemhttp.HeaderKey, v)
	}
	wantProblem(t, post("/orders?op=a&op=b"), http.StatusBadRequest, "invalid-key")
	wantProblem(t, post("/orders?op=with%20space"), http.StatusBadRequest, "invalid-key")
	before := c.n.Load()
	if w := post("/orders"); w.Header().Get(idemhttp.HeaderReplayed) != "" || c.n.Load() != before+1 {
		t.Fatalf("no key: %d, want a pass-through", w.Code)
	}
	e.wantState(t, testTenant, "k1", idem.StateComplete)
}

// TestKeySourceRefused: configurations whose key source cannot work are
// refused by NewMiddleware.
func TestKeySourceRefused(t *testing.T) {
	e := newEnv(t, nil)
	kf := func(*http.Request) (string, error) { return "", nil }
	for name, cfg := range map[string]idemhttp.Config{
		"both":               {KeyHeader: "X-Key", KeyFunc: kf},
		"not a header name":  {KeyHeader: "X Key"},
		"a connection field": {KeyHeader: "Connection"},
		"the replay marker":  {KeyHeader: idemhttp.HeaderReplayed},
		"replayed key field": {KeyHeader: "X-Key", ReplayHeaders: []string{"x-key"}},
	} {
		cfg.TenantFunc = tenantOf
		if _, err := idemhttp.NewMiddleware(e.engine, &cfg); err == nil {
			t.Errorf("%s: NewMiddleware accepted %+v", name, cfg)
		}
	}
}

// TestParseKeyHeader: the exported parser of a custom key field.
func TestParseKeyHeader(t *testing.T) {
	h := http.Header{}
	h.Set("X-Request-Key", `"abc"`)
	if k, err := idemhttp.ParseKeyHeader(h, "x-request-key"); k != "abc" || err != nil {
		t.Fatalf("ParseKeyHeader = %q, %v; want abc", k, err)
	}
	if k, err := idemhttp.ParseKeyHeader(h, idemhttp.HeaderKey); k != "" || err != nil {
		t.Fatalf("ParseKeyHeader of an absent field = %q, %v; want none", k, err)
	}
}
