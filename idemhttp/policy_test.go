package idemhttp_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/atonce"
)

// newMiddleware is env.handler's middleware, for the tests that derive
// routes from it.
func (e *env) middleware(t *testing.T, cfg idemhttp.Config) *idemhttp.Middleware {
	t.Helper()
	if cfg.TenantFunc == nil && !cfg.SharedKeySpace {
		cfg.TenantFunc = tenantOf
	}
	cfg.Logger = quietLogger
	m, err := idemhttp.NewMiddleware(e.engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestPolicyLeaseAtOneBarrier: a route whose policy runs it on an engine
// with a 200ms lease (heartbeat off) is taken over by exactly one of the
// duplicates released together once its stalled first execution is past
// that lease; on the middleware's own route (the default 90s lease) the
// same duplicates all get 409, and only the first execution ever runs.
func TestPolicyLeaseAtOneBarrier(t *testing.T) {
	const n = 10
	e := newEnv(t, nil)
	short, err := idem.NewEngine(e.store, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	base := e.middleware(t, idemhttp.Config{})
	p := base.Policy()
	p.Engine = short
	shortRoute, err := base.With(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		mw        *idemhttp.Middleware
		key       string
		takeovers int64
	}{
		{"default lease", base, "k-base", 0},
		{"per-route 200ms lease", shortRoute, "k-short", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var runs, takeovers atomic.Int64
			release := make(chan struct{})
			h := tc.mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if runs.Add(1) == 1 {
					<-release
				}
				if x, _ := idem.ExecutionFromContext(r.Context()); x.Takeover {
					takeovers.Add(1)
				}
				w.WriteHeader(http.StatusCreated)
			}))
			first := make(chan *httptest.ResponseRecorder)
			go func() { first <- serve(h, request(http.MethodPost, "/orders", tc.key, "a")) }()
			waitFor(t, "the first execution", func() bool { return runs.Load() == 1 })
			e.clock.Advance(300 * time.Millisecond) // past the short lease, not the default one
			answers := make([]*httptest.ResponseRecorder, n)
			atonce.Run(n, func(i int) { answers[i] = serve(h, request(http.MethodPost, "/orders", tc.key, "a")) })
			close(release)
			<-first
			if got := takeovers.Load(); got != tc.takeovers {
				t.Fatalf("%d takeovers, want %d", got, tc.takeovers)
			}
			if got := runs.Load(); got != 1+tc.takeovers {
				t.Fatalf("handler ran %d times, want %d", got, 1+tc.takeovers)
			}
			var created int64
			for i, w := range answers {
				switch {
				case w.Code == http.StatusCreated && w.Header().Get(idemhttp.HeaderReplayed) == "true":
					// The takeover's answer, replayed.
				case w.Code == http.StatusCreated:
					created++
				case w.Code == http.StatusConflict:
					wantProblem(t, w, http.StatusConflict, "in-flight")
				default:
					t.Fatalf("answer %d: %d %q", i, w.Code, w.Body)
				}
			}
			if created != tc.takeovers {
				t.Fatalf("%d duplicates answered 201, want %d", created, tc.takeovers)
			}
		})
	}
}

// TestPolicyPerRoute: With changes the methods, the 5xx rule and the
// storage mode of one route and nothing else; Policy gives back what
// With set; the middleware it came from keeps its own.
func TestPolicyPerRoute(t *testing.T) {
	e := newEnv(t, nil)
	base := e.middleware(t, idemhttp.Config{WaitInFlight: time.Second})
	var runs atomic.Int64
	fail := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusInternalServerError)
	})

	p := base.Policy()
	if p.WaitInFlight != time.Second || len(p.Methods) != 2 {
		t.Fatalf("Policy() = %+v, want the middleware's WaitInFlight and methods", p)
	}
	p.Methods = []string{http.MethodPut}
	p.ReleaseOn5xx = true
	route, err := base.With(p)
	if err != nil {
		t.Fatal(err)
	}
	if got := route.Policy(); got.WaitInFlight != time.Second || !got.ReleaseOn5xx || len(got.Methods) != 1 {
		t.Fatalf("derived Policy() = %+v, want what With set", got)
	}

	// The route: PUT covered, a 5xx releases the key, so its retry runs.
	h := route.Handler(fail)
	for range 2 {
		if w := serve(h, request(http.MethodPut, "/a", "k-put", "x")); w.Code != http.StatusInternalServerError || w.Header().Get(idemhttp.HeaderKey) != "k-put" {
			t.Fatalf("PUT: %d, echo %q; want a covered 500", w.Code, w.Header().Get(idemhttp.HeaderKey))
		}
	}
	if runs.Load() != 2 {
		t.Fatalf("the released 5xx ran %d times, want 2", runs.Load())
	}
	// POST is not covered on the route.
	if w := serve(h, request(http.MethodPost, "/a", "k-post", "x")); w.Header().Get(idemhttp.HeaderKey) != "" {
		t.Fatal("POST covered on a route whose policy names only PUT")
	}
	e.wantAbsent(t, testTenant, "k-post")

	// The base middleware still stores its 5xx, and does not cover PUT.
	runs.Store(0)
	hb := base.Handler(fail)
	serve(hb, request(http.MethodPost, "/b", "k-base", "x"))
	if w := serve(hb, request(http.MethodPost, "/b", "k-base", "x")); w.Header().Get(idemhttp.HeaderReplayed) != "true" || runs.Load() != 1 {
		t.Fatalf("base 5xx retry: replayed=%q after %d runs, want the stored 500", w.Header().Get(idemhttp.HeaderReplayed), runs.Load())
	}
	if w := serve(hb, request(http.MethodPut, "/b", "k-base-put", "x")); w.Header().Get(idemhttp.HeaderKey) != "" {
		t.Fatal("the base middleware covers PUT after With")
	}

	// A marker-mode route needs its ReplayFunc, as NewMiddleware does.
	p = base.Policy()
	p.Mode = idem.ModeMarker
	if _, err := base.With(p); err == nil {
		t.Fatal("With accepted ModeMarker without ReplayFunc")
	}
	p.ReplayFunc = func(w http.ResponseWriter, r *http.Request, res idem.Result) {
		w.WriteHeader(res.Status)
		io.WriteString(w, "rebuilt")
	}
	marker, err := base.With(p)
	if err != nil {
		t.Fatal(err)
	}
	hm := marker.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "original")
	}))
	serve(hm, request(http.MethodPost, "/m", "k-marker", "x"))
	if w := serve(hm, request(http.MethodPost, "/m", "k-marker", "x")); w.Body.String() != "rebuilt" || w.Code != http.StatusCreated {
		t.Fatalf("marker replay: %d %q, want the rebuilt 201", w.Code, w.Body)
	}
}
