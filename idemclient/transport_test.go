package idemclient

import (
	"context"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// uuidV4 is the canonical text form of a version 4, RFC 9562 variant UUID.
var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// seen is what a test server received: one entry per request.
type seen struct {
	mu     sync.Mutex
	keys   []string
	bodies []string
}

func (s *seen) add(r *http.Request) int {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys = append(s.keys, strings.Join(r.Header.Values(headerKey), ","))
	s.bodies = append(s.bodies, string(b))
	return len(s.keys)
}

func (s *seen) snapshot() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.keys)
}

// scripted answers the n-th request (from 1) with script(n).
func scripted(t *testing.T, script func(n int, w http.ResponseWriter)) (*httptest.Server, *seen) {
	t.Helper()
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		script(s.add(r), w)
	}))
	t.Cleanup(srv.Close)
	return srv, s
}

func fastTransport() *Transport {
	return &Transport{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}
}

func TestSameKeyAndBodyOnEveryRetry(t *testing.T) {
	const payload = `{"cart_id":"c_42","total_cents":1900}`
	bodies := map[string]func() io.Reader{
		"GetBody":  func() io.Reader { return strings.NewReader(payload) },
		"buffered": func() io.Reader { return io.MultiReader(strings.NewReader(payload)) },
		// MaxBodyBytes at math.MaxInt64, "no limit": once overflowed
		// into a negative read limit, which sent an empty body.
		"buffered, no limit": func() io.Reader { return io.MultiReader(strings.NewReader(payload)) },
	}
	for name, newBody := range bodies {
		t.Run(name, func(t *testing.T) {
			srv, s := scripted(t, func(n int, w http.ResponseWriter) {
				if n < 3 {
					w.WriteHeader(http.StatusServiceUnavailable)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			var tr Trace
			req, err := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, newBody())
			if err != nil {
				t.Fatal(err)
			}
			tp := fastTransport()
			if name == "buffered, no limit" {
				tp.MaxBodyBytes = math.MaxInt64
			}
			resp, err := NewClient(tp).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("status %d, want 201", resp.StatusCode)
			}
			if s.count() != 3 || tr.Attempts != 3 {
				t.Fatalf("server saw %d requests, trace says %d attempts; want 3 and 3", s.count(), tr.Attempts)
			}
			if !uuidV4.MatchString(tr.Key) {
				t.Fatalf("key %q is not a UUIDv4", tr.Key)
			}
			for i := range s.keys {
				if s.keys[i] != tr.Key {
					t.Errorf("attempt %d sent key %q, want %q", i+1, s.keys[i], tr.Key)
				}
				if s.bodies[i] != payload {
					t.Errorf("attempt %d sent body %q, want %q", i+1, s.bodies[i], payload)
				}
			}
			var statuses []int
			for _, a := range tr.History {
				statuses = append(statuses, a.Status)
			}
			if fmt.Sprint(statuses) != "[503 503 201]" {
				t.Errorf("history statuses %v, want [503 503 201]", statuses)
			}
			if req.Header.Get(headerKey) != "" {
				t.Error("RoundTrip modified the caller's request headers")
			}
		})
	}
}

// RoundTrip called directly with a request whose Header is nil (which
// http.Client never sends, but http.Transport accepts) works, and leaves
// the caller's request as it was.
func TestNilHeader(t *testing.T) {
	srv, s := scripted(t, func(n int, w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) })
	req, err := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = nil
	resp, err := fastTransport().RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.count() != 1 || s.keys[0] == "" || req.Header != nil {
		t.Fatalf("server saw %d requests, key %q; caller's header %v", s.count(), s.keys, req.Header)
	}
}

func TestCallerKeyIsKept(t *testing.T) {
	srv, s := scripted(t, func(n int, w http.ResponseWriter) {
		if n == 1 {
			w.WriteHeader(http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	req, _ := http.NewRequest(http.MethodPatch, srv.URL, strings.NewReader("x"))
	req.Header.Set(headerKey, "caller-key-1")
	resp, err := NewClient(fastTransport()).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := fmt.Sprint(s.keys); got != "[caller-key-1 caller-key-1]" {
		t.Fatalf("keys sent %s, want the caller's key twice", got)
	}
}

func TestRetriedStatuses(t *testing.T) {
	for _, status := range []int{409, 429, 502, 503, 504} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			srv, s := scripted(t, func(n int, w http.ResponseWriter) {
				if n == 1 {
					w.WriteHeader(status)
					return
				}
				w.WriteHeader(http.StatusCreated)
			})
			resp, err := NewClient(fastTransport()).Post(srv.URL, "text/plain", strings.NewReader("x"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated || s.count() != 2 {
				t.Fatalf("got %d after %d requests, want 201 after 2", resp.StatusCode, s.count())
			}
		})
	}
}

func TestNotRetried(t *testing.T) {
	cases := map[string]func(w http.ResponseWriter){
		"400":             func(w http.ResponseWriter) { w.WriteHeader(400) },
		"404":             func(w http.ResponseWriter) { w.WriteHeader(404) },
		"422":             func(w http.ResponseWriter) { w.WriteHeader(422) },
		"500":             func(w http.ResponseWriter) { w.WriteHeader(500) },
		"replayed 503":    func(w http.ResponseWriter) { w.Header().Set(headerReplayed, "true"); w.WriteHeader(503) },
		"Retry-After 120": func(w http.ResponseWriter) { w.Header().Set("Retry-After", "120"); w.WriteHeader(503) },
	}
	for name, answer := range cases {
		t.Run(name, func(t *testing.T) {
			srv, s := scripted(t, func(_ int, w http.ResponseWriter) { answer(w) })
			var tr Trace
			req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, strings.NewReader("x"))
			resp, err := NewClient(fastTransport()).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if s.count() != 1 || tr.Attempts != 1 {
				t.Fatalf("%d requests (%d attempts), want 1", s.count(), tr.Attempts)
			}
			if tr.Replayed != (name == "replayed 503") {
				t.Errorf("Trace.Replayed = %v", tr.Replayed)
			}
		})
	}
}

func TestMaxAttemptsReturnsLastResponse(t *testing.T) {
	srv, s := scripted(t, func(_ int, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	tp := fastTransport()
	tp.MaxAttempts = 3
	resp, err := NewClient(tp).Post(srv.URL, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || s.count() != 3 {
		t.Fatalf("got %d after %d requests, want 503 after 3", resp.StatusCode, s.count())
	}
}

func TestMethodNotCoveredPassesThrough(t *testing.T) {
	srv, s := scripted(t, func(_ int, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
	var tr Trace
	req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPut, srv.URL, strings.NewReader("x"))
	resp, err := NewClient(fastTransport()).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.count() != 1 || s.keys[0] != "" || tr.Key != "" {
		t.Fatalf("PUT: %d requests, key %q; want one request without a key", s.count(), s.keys[0])
	}
}

// A connection closed before any response is the lost-response case: the
// retry must carry the same key.
func TestConnectionErrorIsRetriedWithSameKey(t *testing.T) {
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.add(r) == 1 {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	var tr Trace
	req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := NewClient(fastTransport()).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.count() != 2 || s.keys[0] != s.keys[1] || s.keys[0] == "" {
		t.Fatalf("keys sent %q, want the same key twice", s.keys)
	}
	if tr.History[0].Err == nil || tr.History[0].Status != 0 {
		t.Errorf("first attempt recorded as %+v, want a connection error", tr.History[0])
	}
}

// The first attempt is stuck; the Transport gives it up after
// AttemptTimeout and retries with the same key. On a busy machine a later
// attempt may time out too: every attempt but the last must have timed
// out, and the last got the answer.
func TestAttemptTimeoutRetriesWithSameKey(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.add(r) == 1 {
			select { // a stuck first attempt
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tp := fastTransport()
	tp.AttemptTimeout = 100 * time.Millisecond
	tp.MaxAttempts = 20
	var tr Trace
	req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := NewClient(tp).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || tr.Attempts < 2 {
		t.Fatalf("got %d after %d attempts, want 201 after at least 2", resp.StatusCode, tr.Attempts)
	}
	for i, a := range tr.History[:len(tr.History)-1] {
		if !errors.Is(a.Err, ErrAttemptTimeout) {
			t.Errorf("attempt %d: %+v, want ErrAttemptTimeout", i+1, a)
		}
	}
	keys := s.snapshot()
	for _, k := range keys {
		if k != tr.Key {
			t.Errorf("keys %q, want %q on every attempt", keys, tr.Key)
		}
	}
}

func TestStopsWhenContextEnds(t *testing.T) {
	first := make(chan struct{})
	var once sync.Once
	srv, s := scripted(t, func(_ int, w http.ResponseWriter) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(http.StatusConflict)
		once.Do(func() { close(first) })
	})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-first; cancel() }()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
	_, err := NewClient(fastTransport()).Do(req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if s.count() != 1 {
		t.Fatalf("%d requests, want 1: the pause must end with the context", s.count())
	}
}

// Many operations at the same instant through one Transport: each gets its
// own key, and each keeps it across its retries.
func TestConcurrentOperationsGetDistinctKeys(t *testing.T) {
	const n = 24
	var mu sync.Mutex
	keysByOp := map[string]map[string]int{} // body → key → requests
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		if keysByOp[string(b)] == nil {
			keysByOp[string(b)] = map[string]int{}
		}
		keysByOp[string(b)][r.Header.Get(headerKey)]++
		tries := keysByOp[string(b)][r.Header.Get(headerKey)]
		mu.Unlock()
		if tries < 2 {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	client := NewClient(fastTransport())
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := client.Post(srv.URL, "text/plain", strings.NewReader(fmt.Sprint("op", i)))
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				errs <- fmt.Errorf("op %d: status %d", i, resp.StatusCode)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	all := map[string]bool{}
	for op, keys := range keysByOp {
		if len(keys) != 1 {
			t.Errorf("%s was sent with %d keys, want 1", op, len(keys))
		}
		for k := range keys {
			all[k] = true
		}
	}
	if len(keysByOp) != n || len(all) != n {
		t.Fatalf("%d operations with %d distinct keys, want %d and %d", len(keysByOp), len(all), n, n)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"3", 3 * time.Second, true},
		{" 0 ", 0, true},
		{"-1", 0, false},
		{"", 0, false},
		{"soon", 0, false},
		{now.Add(7 * time.Second).Format(http.TimeFormat), 7 * time.Second, true},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0, true},
		{now.Add(90 * time.Second).Format(time.RFC850), 90 * time.Second, true},
		// Too many digits for int64: still a (very long) wait, capped.
		{"99999999999999999999", 24 * time.Hour, true},
		{"-99999999999999999999", 0, false},
	}
	for _, c := range cases {
		got, ok := parseRetryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestBackoffIsCappedAndJittered(t *testing.T) {
	tp := &Transport{BaseDelay: 10 * time.Millisecond, MaxDelay: 80 * time.Millisecond}
	for n := 1; n <= 70; n++ {
		ceiling := min(80*time.Millisecond, 10*time.Millisecond<<min(n-1, 10))
		distinct := map[time.Duration]bool{}
		for range 50 {
			d := tp.backoff(n)
			if d < ceiling/2 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, outside [%v, %v]", n, d, ceiling/2, ceiling)
			}
			distinct[d] = true
		}
		if len(distinct) < 2 {
			t.Fatalf("backoff(%d) drew one value 50 times: no jitter", n)
		}
	}
}

// arrivals is a server answering every request with answer, and recording
// when each arrived.
func arrivals(t *testing.T, answer func(w http.ResponseWriter)) (*httptest.Server, func() []time.Time) {
	t.Helper()
	var mu sync.Mutex
	var at []time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		mu.Unlock()
		answer(w)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Time(nil), at...)
	}
}

// A Retry-After that asks for no pause (0, a date in the past) or that
// cannot be read (negative, not a number) never makes the Transport send
// its attempts back to back: every pause keeps the backoff's floor, half
// of BaseDelay. A huge one returns the answer.
func TestRetryAfterKeepsAFloor(t *testing.T) {
	const base = 20 * time.Millisecond
	forms := map[string]func() string{
		"0":           func() string { return "0" },
		"past date":   func() string { return time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat) },
		"negative":    func() string { return "-3" },
		"not a delay": func() string { return "soon" },
		"fraction":    func() string { return "0.5" },
	}
	for name, value := range forms {
		t.Run(name, func(t *testing.T) {
			srv, arrived := arrivals(t, func(w http.ResponseWriter) {
				w.Header().Set("Retry-After", value())
				w.WriteHeader(http.StatusServiceUnavailable)
			})
			tp := &Transport{BaseDelay: base, MaxDelay: 2 * base, MaxAttempts: 4}
			var tr Trace
			req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, strings.NewReader("x"))
			resp, err := NewClient(tp).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			at := arrived()
			if resp.StatusCode != http.StatusServiceUnavailable || tr.Attempts != 4 || len(at) != 4 {
				t.Fatalf("got %d after %d attempts (%d arrived), want 503 after 4", resp.StatusCode, tr.Attempts, len(at))
			}
			for i, a := range tr.History[:3] {
				if a.Wait < base/2 {
					t.Errorf("pause after attempt %d: %v, want at least %v", i+1, a.Wait, base/2)
				}
				// The next attempt leaves after the answer and the pause,
				// so the server sees them at least that far apart.
				if gap := at[i+1].Sub(at[i]); gap < a.Wait {
					t.Errorf("attempts %d and %d arrived %v apart, less than the pause %v", i+1, i+2, gap, a.Wait)
				}
			}
		})
	}
	t.Run("huge", func(t *testing.T) {
		srv, arrived := arrivals(t, func(w http.ResponseWriter) {
			w.Header().Set("Retry-After", "99999999999999999999")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		resp, err := NewClient(&Transport{BaseDelay: base}).Post(srv.URL, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if n := len(arrived()); resp.StatusCode != http.StatusServiceUnavailable || n != 1 {
			t.Fatalf("got %d after %d requests, want the 503 at once", resp.StatusCode, n)
		}
	})
}

// 409s do not spend MaxAttempts, but have a budget of their own,
// InFlightTimeout, counted from the first 409: the pauses taken after
// 409s all fit in it.
func TestInFlightBudget(t *testing.T) {
	conflict := func(retryAfter string) func(w http.ResponseWriter) {
		return func(w http.ResponseWriter) {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(http.StatusConflict)
		}
	}
	t.Run("bounded", func(t *testing.T) {
		srv, arrived := arrivals(t, conflict(""))
		// MaxAttempts 1: any retry at all shows that 409s do not spend
		// it. The first 409 always leaves the whole budget, so there is
		// always one, however slow the machine.
		const budget = 300 * time.Millisecond
		tp := &Transport{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond, MaxAttempts: 1, InFlightTimeout: budget}
		var tr Trace
		req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, strings.NewReader("x"))
		resp, err := NewClient(tp).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || tr.Attempts < 2 || len(arrived()) != tr.Attempts {
			t.Fatalf("got %d after %d attempts, want 409 after more than MaxAttempts (1)", resp.StatusCode, tr.Attempts)
		}
		var paused time.Duration
		for _, a := range tr.History {
			paused += a.Wait
		}
		if paused > budget {
			t.Fatalf("paused %v in all after 409s, more than InFlightTimeout %v", paused, budget)
		}
		if last := tr.History[len(tr.History)-1]; last.Wait != 0 || last.Status != http.StatusConflict {
			t.Fatalf("last attempt %+v", last)
		}
	})
	t.Run("Retry-After past the budget", func(t *testing.T) {
		srv, arrived := arrivals(t, conflict("60"))
		tp := &Transport{InFlightTimeout: 30 * time.Second}
		resp, err := NewClient(tp).Post(srv.URL, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if n := len(arrived()); resp.StatusCode != http.StatusConflict || n != 1 {
			t.Fatalf("got %d after %d requests, want the 409 at once", resp.StatusCode, n)
		}
	})
	t.Run("negative", func(t *testing.T) {
		srv, arrived := arrivals(t, conflict(""))
		resp, err := NewClient(&Transport{InFlightTimeout: -1}).Post(srv.URL, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if n := len(arrived()); resp.StatusCode != http.StatusConflict || n != 1 {
			t.Fatalf("got %d after %d requests, want the 409 at once", resp.StatusCode, n)
		}
	})
	t.Run("context", func(t *testing.T) {
		srv, _ := arrivals(t, conflict("1"))
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
		resp, err := NewClient(&Transport{}).Do(req) // InFlightTimeout: 2 minutes
		switch {
		case err == nil:
			resp.Body.Close()
			if resp.StatusCode != http.StatusConflict {
				t.Fatalf("status %d, want the last 409", resp.StatusCode)
			}
		case !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("err %v, want the last 409 or the context's end", err)
		}
	})
}

// A 303 (or 301, 302) turns the operation into a GET for its result:
// that GET is another request and carries no key of the Transport's.
func TestSeeOtherDropsTheKey(t *testing.T) {
	srv, s := scripted(t, func(n int, w http.ResponseWriter) {
		if n == 1 {
			w.Header().Set("Location", "/orders/1")
			w.WriteHeader(http.StatusSeeOther)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	var tr Trace
	req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL+"/orders", strings.NewReader("x"))
	resp, err := NewClient(fastTransport()).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.count() != 2 || s.keys[0] == "" || s.keys[1] != "" {
		t.Fatalf("keys sent %q, want one on the POST and none on the GET", s.keys)
	}
	if tr.Key != s.keys[0] || tr.Attempts != 2 {
		t.Fatalf("trace %+v: want the POST's key and both requests", tr)
	}
}

// idemclient's own code imports only the standard library: a program that
// wants the retrying client gets no other module with it.
func TestNoThirdPartyImports(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s, outside the standard library", name, path)
			}
		}
	}
}

// endedBase sends each attempt through http.DefaultTransport and counts
// those it is given after their context has ended; after, when set, runs
// once the n-th attempt (from 1) got its outcome.
type endedBase struct {
	mu       sync.Mutex
	attempts int
	afterEnd int
	after    func(n int)
}

func (b *endedBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	b.attempts++
	n := b.attempts
	if r.Context().Err() != nil {
		b.afterEnd++
	}
	b.mu.Unlock()
	resp, err := http.DefaultTransport.RoundTrip(r)
	if b.after != nil {
		b.after(n)
	}
	return resp, err
}

func (b *endedBase) counts() (attempts, afterEnd int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.attempts, b.afterEnd
}

// closeCounter is a request body that counts its Close calls.
type closeCounter struct {
	io.Reader
	mu     sync.Mutex
	closed int
}

func (c *closeCounter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed++
	return nil
}

// No attempt reaches the base transport once the caller's context has
// ended, whether it ended before the call, as a pause ended, or while
// http.Client was following a redirect: the Transport returns the
// context's error, and closes a body it was given and did not send.
func TestNoAttemptAfterTheContextEnded(t *testing.T) {
	t.Run("before the call", func(t *testing.T) {
		srv, s := scripted(t, func(_ int, w http.ResponseWriter) { w.WriteHeader(http.StatusCreated) })
		for _, body := range []io.Reader{strings.NewReader("x"), &closeCounter{Reader: strings.NewReader("x")}} {
			base := &endedBase{}
			tp := fastTransport()
			tp.Base = base
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, body)
			if c, ok := body.(*closeCounter); ok {
				// A body the Transport rewinds through GetBody, not one
				// it reads (and closes) to keep it.
				req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("x")), nil }
				req.Body = c
			}
			resp, err := tp.RoundTrip(req)
			if resp != nil || !errors.Is(err, context.Canceled) {
				t.Fatalf("got %v, %v; want context.Canceled", resp, err)
			}
			if attempts, _ := base.counts(); attempts != 0 || s.count() != 0 {
				t.Fatalf("%d attempts reached the base transport, %d the server; want none", attempts, s.count())
			}
			if c, ok := body.(*closeCounter); ok && c.closed != 1 {
				t.Fatalf("the request body was closed %d times, want once", c.closed)
			}
		}
	})
	t.Run("as a pause ends", func(t *testing.T) {
		srv, s := scripted(t, func(_ int, w http.ResponseWriter) { w.WriteHeader(http.StatusServiceUnavailable) })
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The first answer is retryable; the context ends as it comes
		// back, and the pause before the retry is (close to) nothing.
		base := &endedBase{after: func(int) { cancel() }}
		tp := &Transport{Base: base, BaseDelay: time.Nanosecond, MaxDelay: time.Nanosecond}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
		_, err := NewClient(tp).Do(req)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if attempts, afterEnd := base.counts(); attempts != 1 || afterEnd != 0 || s.count() != 1 {
			t.Fatalf("%d attempts, %d after the context ended, %d requests; want 1, 0, 1", attempts, afterEnd, s.count())
		}
	})
	t.Run("during a redirect", func(t *testing.T) {
		srv, s := scripted(t, func(n int, w http.ResponseWriter) {
			if n == 1 {
				w.Header().Set("Location", "/next")
				w.WriteHeader(http.StatusTemporaryRedirect)
				return
			}
			w.WriteHeader(http.StatusCreated)
		})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		// The 307 comes back as the context ends: http.Client follows it
		// all the same, through the Transport.
		base := &endedBase{after: func(int) { cancel() }}
		tp := fastTransport()
		tp.Base = base
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
		_, err := NewClient(tp).Do(req)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if attempts, afterEnd := base.counts(); attempts != 1 || afterEnd != 0 || s.count() != 1 {
			t.Fatalf("%d attempts, %d after the context ended, %d requests; want 1, 0, 1", attempts, afterEnd, s.count())
		}
	})
}
