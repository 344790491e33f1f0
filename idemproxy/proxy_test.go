package idemproxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemproxy"
	"github.com/idem-go/idem/internal/atonce"
)

var quiet = slog.New(slog.DiscardHandler)

// fixture is a proxy over idemmem in front of upstream.
type fixture struct {
	t      *testing.T
	url    string
	engine *idem.Engine
	store  *idemmem.Store
}

func newFixture(t *testing.T, upstream string, lease time.Duration, cfg idemproxy.Config) *fixture {
	t.Helper()
	store := idemmem.NewStore(nil)
	engine, err := idem.NewEngine(store, &idem.Config{Lease: lease, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = engine.Close(context.Background()) })
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Upstream = u
	if cfg.Middleware.TenantFunc == nil {
		cfg.Middleware.SharedKeySpace = true
	}
	cfg.Middleware.Logger = quiet
	p, err := idemproxy.New(engine, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return &fixture{t: t, url: srv.URL, engine: engine, store: store}
}

type answer struct {
	status   int
	header   http.Header
	body     string
	replayed bool
	slug     string // the problem's slug, "" for none
}

func (f *fixture) post(path, key, body string, header ...string) answer {
	f.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: string(b), replayed: resp.Header.Get("Idempotent-Replayed") == "true"}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct{ Type string }
		if json.Unmarshal(b, &p) == nil {
			a.slug = p.Type[strings.LastIndexByte(p.Type, '#')+1:]
		}
	}
	return a
}

// untilNot retries until the answer is no longer 409 (the lease ended).
func (f *fixture) untilNot409(path, key, body string) answer {
	f.t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if a := f.post(path, key, body); a.status != http.StatusConflict {
			return a
		}
		if time.Now().After(deadline) {
			f.t.Fatal("the key stayed in flight for a minute")
		}
	}
}

// counter is a Go upstream that counts its calls and answers 201 with
// the count.
func counter(t *testing.T, calls *atomic.Int64, also func(w http.ResponseWriter, r *http.Request, n int64) bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // read whole, as a service would
		n := calls.Add(1)
		if also != nil && also(w, r, n) {
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "call "+strconv.FormatInt(n, 10)) //nolint:errcheck // test
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestForwarding: the upstream gets the key and the forwarding headers;
// Set-Cookie reaches the first answer and never a replay; hop-by-hop
// headers are dropped both ways.
func TestForwarding(t *testing.T) {
	var calls atomic.Int64
	var seen http.Header
	var seenHost string
	up := counter(t, &calls, func(w http.ResponseWriter, r *http.Request, _ int64) bool {
		seen, seenHost = r.Header.Clone(), r.Host
		w.Header().Set("Set-Cookie", "session=1")
		w.Header().Set("Location", "/orders/1")
		w.Header().Set("Connection", "X-Upstream-Hop")
		w.Header().Set("X-Upstream-Hop", "secret")
		return false
	})
	f := newFixture(t, up.URL, 0, idemproxy.Config{})
	first := f.post("/orders", "k1", "a", "Connection", "X-Client-Hop", "X-Client-Hop", "x")
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first answer %d replayed=%v", first.status, first.replayed)
	}
	if got := seen.Get("Idempotency-Key"); got != "k1" {
		t.Errorf("the upstream got Idempotency-Key %q, want k1", got)
	}
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if seen.Get(h) == "" {
			t.Errorf("the upstream got no %s", h)
		}
	}
	if seen.Get("X-Client-Hop") != "" {
		t.Error("a hop-by-hop header of the client reached the upstream")
	}
	if !strings.HasPrefix(seenHost, "127.0.0.1:") || seenHost == strings.TrimPrefix(up.URL, "http://") {
		t.Errorf("the upstream saw Host %q, want the proxy's", seenHost)
	}
	if first.header.Get("Set-Cookie") == "" {
		t.Error("the first answer lost its Set-Cookie")
	}
	if first.header.Get("X-Upstream-Hop") != "" {
		t.Error("a hop-by-hop header of the upstream reached the client")
	}
	again := f.post("/orders", "k1", "a")
	if !again.replayed || again.body != "call 1" || again.header.Get("Location") != "/orders/1" {
		t.Fatalf("the retry: %+v, want the first answer replayed with its Location", again)
	}
	if again.header.Get("Set-Cookie") != "" {
		t.Error("a replay carried the first answer's Set-Cookie")
	}
	if calls.Load() != 1 {
		t.Errorf("the upstream ran %d times, want 1", calls.Load())
	}
}

// TestKeyListedAsHopByHop: a client that names Idempotency-Key in its
// Connection header still has its key reach the upstream, which may
// deduplicate too: the proxy acted on the key, so it is not this hop's
// alone.
func TestKeyListedAsHopByHop(t *testing.T) {
	var calls atomic.Int64
	var seen atomic.Value
	up := counter(t, &calls, func(w http.ResponseWriter, r *http.Request, _ int64) bool {
		seen.Store(r.Header.Clone())
		return false
	})
	f := newFixture(t, up.URL, 0, idemproxy.Config{})
	first := f.post("/orders", "k-hop", "a", "Connection", "Idempotency-Key, X-Client-Hop", "X-Client-Hop", "x")
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first answer %d replayed=%v", first.status, first.replayed)
	}
	h := seen.Load().(http.Header)
	if got := h.Values("Idempotency-Key"); len(got) != 1 || got[0] != "k-hop" {
		t.Errorf("the upstream got Idempotency-Key %q, want [k-hop]", got)
	}
	if h.Get("X-Client-Hop") != "" {
		t.Error("a hop-by-hop header of the client reached the upstream")
	}
	// Without a key, nothing is added.
	f.post("/orders", "", "a", "Connection", "Idempotency-Key")
	if got := seen.Load().(http.Header).Values("Idempotency-Key"); len(got) != 0 {
		t.Errorf("a request without a key reached the upstream with Idempotency-Key %q", got)
	}
}

// TestRoutes: only the routes given are protected; others are forwarded
// as they are.
func TestRoutes(t *testing.T) {
	var calls atomic.Int64
	up := counter(t, &calls, nil)
	f := newFixture(t, up.URL, 0, idemproxy.Config{Routes: []string{"POST /orders", "PUT /payments/{id}/capture"}})
	f.post("/orders", "r", "a")
	if a := f.post("/orders", "r", "a"); !a.replayed {
		t.Errorf("POST /orders not protected: %+v", a)
	}
	for _, path := range []string{"/other", "/orders/", "/orders/7"} {
		f.post(path, "r", "a")
		if a := f.post(path, "r", "a"); a.replayed || a.header.Get("Idempotency-Key") != "" {
			t.Errorf("POST %s was protected by the route POST /orders: %+v", path, a)
		}
	}
	req, _ := http.NewRequest(http.MethodPut, f.url+"/payments/7/capture", nil)
	req.Header.Set("Idempotency-Key", "p")
	for range 2 {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if got := calls.Load(); got != 8 {
		t.Errorf("the upstream ran %d times, want 8 (one per protected key, six unprotected)", got)
	}
	if _, err := idemproxy.New(f.engine, &idemproxy.Config{Upstream: &url.URL{Scheme: "http", Host: "x"}, Routes: []string{"/orders"},
		Middleware: idemhttp.Config{SharedKeySpace: true}}); err == nil {
		t.Error("a route without a method was accepted")
	}
}

// TestUpstreamUnreachableThenRestarted: nothing reached the upstream, so
// the key is released with 502; once the upstream is back, the retry
// with the same key runs.
func TestUpstreamUnreachableThenRestarted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	f := newFixture(t, "http://"+addr, 0, idemproxy.Config{})
	a := f.post("/orders", "down", "a")
	if a.status != http.StatusBadGateway || a.slug != idemproxy.SlugUpstreamUnreachable || a.header.Get("Retry-After") == "" {
		t.Fatalf("an unreachable upstream: %d %q Retry-After %q, want 502 %s with Retry-After", a.status, a.slug, a.header.Get("Retry-After"), idemproxy.SlugUpstreamUnreachable)
	}
	if a.header.Get("Idempotency-Key") != "down" {
		t.Error("the key was not echoed")
	}
	var calls atomic.Int64
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("skipping: the port was taken meanwhile: %v", err)
	}
	srv := &http.Server{Handler: counter(t, &calls, nil).Config.Handler}
	go srv.Serve(ln) //nolint:errcheck // closed below
	t.Cleanup(func() { srv.Close() })
	if b := f.post("/orders", "down", "a"); b.status != http.StatusCreated || b.replayed {
		t.Fatalf("the retry once the upstream is back: %d replayed=%v, want a fresh 201", b.status, b.replayed)
	}
	if calls.Load() != 1 {
		t.Errorf("the upstream ran %d times, want 1", calls.Load())
	}
}

// TestUpstreamTimeout: a request sent and not answered in time may have
// run: 504, the key held until its lease ends, then the retry runs.
func TestUpstreamTimeout(t *testing.T) {
	var calls atomic.Int64
	release := make(chan struct{})
	up := counter(t, &calls, func(_ http.ResponseWriter, _ *http.Request, n int64) bool {
		if n == 1 {
			<-release // slower than the timeout
		}
		return false
	})
	t.Cleanup(func() { close(release) })
	f := newFixture(t, up.URL, 300*time.Millisecond, idemproxy.Config{UpstreamTimeout: 50 * time.Millisecond})
	a := f.post("/orders", "slow", "a")
	if a.status != http.StatusGatewayTimeout || a.slug != idemproxy.SlugOutcomeUnknown {
		t.Fatalf("a timed-out upstream: %d %q, want 504 %s", a.status, a.slug, idemproxy.SlugOutcomeUnknown)
	}
	if b := f.post("/orders", "slow", "a"); b.status != http.StatusConflict {
		t.Fatalf("a retry during the lease: %d, want 409", b.status)
	}
	if calls.Load() != 1 {
		t.Fatalf("the upstream ran %d times during the lease, want 1", calls.Load())
	}
	c := f.untilNot409("/orders", "slow", "a")
	if c.status != http.StatusCreated || c.replayed || c.body != "call 2" {
		t.Fatalf("the retry after the lease: %+v, want the second call's 201", c)
	}
}

// TestSlowUpstreamDuplicatesWait: duplicates released at one barrier
// while a slow upstream works wait for its answer (--wait-in-flight) and
// get it replayed; the upstream runs once.
func TestSlowUpstreamDuplicatesWait(t *testing.T) {
	var calls atomic.Int64
	entered := make(chan struct{})
	proceed := make(chan struct{})
	up := counter(t, &calls, func(_ http.ResponseWriter, _ *http.Request, n int64) bool {
		if n == 1 {
			close(entered)
			<-proceed
		}
		return false
	})
	f := newFixture(t, up.URL, 0, idemproxy.Config{Middleware: idemhttp.Config{WaitInFlight: time.Minute}})
	first := make(chan answer, 1)
	go func() { first <- f.post("/orders", "w", "a") }()
	<-entered
	const n = 8
	got := make([]answer, n)
	done := make(chan struct{})
	go func() {
		atonce.Run(n, func(i int) { got[i] = f.post("/orders", "w", "a") })
		close(done)
	}()
	// Give the duplicates a moment to reach the proxy and wait there. No
	// outcome depends on it: one that arrives after the answer gets a
	// replay too, and none may run the upstream.
	time.Sleep(50 * time.Millisecond)
	close(proceed)
	<-done
	if a := <-first; a.status != http.StatusCreated || a.replayed {
		t.Fatalf("the first: %+v", a)
	}
	for i, a := range got {
		if !a.replayed || a.body != "call 1" {
			t.Errorf("duplicate %d: %d replayed=%v %q, want the first answer replayed", i, a.status, a.replayed, a.body)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("the upstream ran %d times, want 1", calls.Load())
	}
}

// TestConnectionLost: an upstream that drops the connection after it got
// the request, or breaks its answer off, may have run: 502, key held.
func TestConnectionLost(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(w http.ResponseWriter)
	}{
		{"BeforeAnswer", func(w http.ResponseWriter) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}},
		{"MidAnswer", func(w http.ResponseWriter) {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusCreated)
			io.WriteString(w, "ten bytes.") //nolint:errcheck // then cut
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int64
			up := counter(t, &calls, func(w http.ResponseWriter, _ *http.Request, n int64) bool {
				if n == 1 {
					tc.fail(w)
					return true
				}
				return false
			})
			f := newFixture(t, up.URL, 300*time.Millisecond, idemproxy.Config{})
			a := f.post("/orders", "lost", "a")
			if a.status != http.StatusBadGateway || a.slug != idemproxy.SlugOutcomeUnknown {
				t.Fatalf("a lost connection: %d %q %q, want 502 %s", a.status, a.slug, a.body, idemproxy.SlugOutcomeUnknown)
			}
			if b := f.post("/orders", "lost", "a"); b.status != http.StatusConflict {
				t.Fatalf("a retry during the lease: %d, want 409", b.status)
			}
			if c := f.untilNot409("/orders", "lost", "a"); c.status != http.StatusCreated || c.body != "call 2" {
				t.Fatalf("the retry after the lease: %+v", c)
			}
		})
	}
}

// TestUpstream5xx: stored and replayed by default; released with
// ReleaseOn5xx, so that the retry runs.
func TestUpstream5xx(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run("ReleaseOn5xx="+strconv.FormatBool(release), func(t *testing.T) {
			var calls atomic.Int64
			up := counter(t, &calls, func(w http.ResponseWriter, _ *http.Request, n int64) bool {
				if n == 1 {
					http.Error(w, "boom", http.StatusInternalServerError)
					return true
				}
				return false
			})
			f := newFixture(t, up.URL, 0, idemproxy.Config{Middleware: idemhttp.Config{ReleaseOn5xx: release}})
			if a := f.post("/orders", "5", "a"); a.status != http.StatusInternalServerError {
				t.Fatalf("first: %d", a.status)
			}
			b := f.post("/orders", "5", "a")
			switch {
			case release && (b.status != http.StatusCreated || b.replayed):
				t.Fatalf("the retry after a released 5xx: %+v, want a fresh 201", b)
			case !release && (b.status != http.StatusInternalServerError || !b.replayed):
				t.Fatalf("the retry after a stored 5xx: %+v, want the 500 replayed", b)
			}
		})
	}
}

// TestLargeAnswerPassedThrough: an answer over the store limit, declared
// or chunked, reaches the client whole and unstored; the key is kept, and
// a retry gets the answer-not-stored marker under the same status,
// without the upstream running again.
func TestLargeAnswerPassedThrough(t *testing.T) {
	const limit = 1 << 10
	big := strings.Repeat("x", 3*limit)
	for _, chunked := range []bool{false, true} {
		t.Run("chunked="+strconv.FormatBool(chunked), func(t *testing.T) {
			var calls atomic.Int64
			up := counter(t, &calls, func(w http.ResponseWriter, _ *http.Request, _ int64) bool {
				w.Header().Set("ETag", `"big"`)
				if !chunked {
					w.Header().Set("Content-Length", strconv.Itoa(len(big)))
				}
				w.WriteHeader(http.StatusCreated)
				for i := 0; i < len(big); i += 100 {
					io.WriteString(w, big[i:min(i+100, len(big))]) //nolint:errcheck // test
					w.(http.Flusher).Flush()
				}
				return true
			})
			f := newFixture(t, up.URL, 0, idemproxy.Config{Middleware: idemhttp.Config{MaxResponseBody: limit}})
			a := f.post("/orders", "big", "a")
			if a.status != http.StatusCreated || a.body != big || a.replayed {
				t.Fatalf("the large answer: %d, %d bytes, replayed=%v; want 201 with all %d bytes", a.status, len(a.body), a.replayed, len(big))
			}
			b := f.post("/orders", "big", "a")
			if b.status != http.StatusCreated || !b.replayed || b.slug != idemproxy.SlugAnswerNotStored || b.header.Get("ETag") != "" {
				t.Fatalf("the retry: %d replayed=%v slug %q ETag %q, want 201 replayed %s without the answer's ETag", b.status, b.replayed, b.slug, b.header.Get("ETag"), idemproxy.SlugAnswerNotStored)
			}
			if calls.Load() != 1 {
				t.Errorf("the upstream ran %d times, want 1", calls.Load())
			}
		})
	}
}

// TestEventStreamPassedThrough: a text/event-stream answer reaches the
// client as it comes (the client reads the first event before the
// upstream writes the second), and the key is kept.
func TestEventStreamPassedThrough(t *testing.T) {
	var calls atomic.Int64
	next := make(chan struct{})
	up := counter(t, &calls, func(w http.ResponseWriter, _ *http.Request, _ int64) bool {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: one\n\n") //nolint:errcheck // test
		w.(http.Flusher).Flush()
		<-next
		io.WriteString(w, "data: two\n\n") //nolint:errcheck // test
		return true
	})
	f := newFixture(t, up.URL, 0, idemproxy.Config{})
	// Bounded, so that a proxy that holds the stream fails rather than
	// hangs: the upstream waits for the client to read the first event.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, f.url+"/events", strings.NewReader("a"))
	req.Header.Set("Idempotency-Key", "sse")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || line != "data: one\n" {
		t.Fatalf("first event: %q %v", line, err)
	}
	close(next)
	rest, _ := io.ReadAll(r)
	cancel()
	resp.Body.Close()
	if string(rest) != "\ndata: two\n\n" {
		t.Fatalf("the rest of the stream: %q", rest)
	}
	if b := f.post("/events", "sse", "a"); !b.replayed || b.slug != idemproxy.SlugAnswerNotStored || b.status != http.StatusOK {
		t.Fatalf("the retry: %+v, want the answer-not-stored marker replayed", b)
	}
	if calls.Load() != 1 {
		t.Errorf("the upstream ran %d times, want 1", calls.Load())
	}
}

// TestBearerTenant: two credentials are two key spaces; the tenant holds
// no trace of the credential; a request without one is refused.
func TestBearerTenant(t *testing.T) {
	if _, err := idemproxy.BearerTenant([]byte("short")); err == nil {
		t.Error("a short secret was accepted")
	}
	rule, err := idemproxy.BearerTenant([]byte("0123456789abcdef-secret"))
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int64
	up := counter(t, &calls, nil)
	f := newFixture(t, up.URL, 0, idemproxy.Config{Middleware: idemhttp.Config{TenantFunc: rule}})
	const cred = "tok-alice-credential"
	f.post("/orders", "b", "a", "Authorization", "Bearer "+cred)
	if a := f.post("/orders", "b", "a", "Authorization", "Bearer tok-bob"); a.replayed {
		t.Error("another credential got the first one's answer")
	}
	if a := f.post("/orders", "b", "a"); a.status != http.StatusUnauthorized {
		t.Errorf("no credential: %d, want 401", a.status)
	}
	req := httptest.NewRequest(http.MethodPost, "/", nil)
	req.Header.Set("Authorization", "Bearer "+cred)
	tenant, err := rule(req)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tenant, cred) || strings.Contains(tenant, "alice") {
		t.Errorf("the tenant %q shows the credential", tenant)
	}
	if rec, err := f.store.Get(t.Context(), tenant, "b"); err != nil || rec == nil {
		t.Errorf("no record under the derived tenant: %v", err)
	}
	if calls.Load() != 2 {
		t.Errorf("the upstream ran %d times, want 2", calls.Load())
	}
}
