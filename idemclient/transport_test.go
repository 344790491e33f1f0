package idemclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

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
			u, err := uuid.Parse(tr.Key)
			if err != nil || u.Version() != 4 {
				t.Fatalf("key %q is not a UUIDv4 (%v)", tr.Key, err)
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
	tp.AttemptTimeout = 50 * time.Millisecond
	var tr Trace
	req, _ := http.NewRequestWithContext(WithTrace(context.Background(), &tr), http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := NewClient(tp).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || tr.Attempts != 2 {
		t.Fatalf("got %d after %d attempts, want 201 after 2", resp.StatusCode, tr.Attempts)
	}
	if !errors.Is(tr.History[0].Err, ErrAttemptTimeout) {
		t.Errorf("first attempt error %v, want ErrAttemptTimeout", tr.History[0].Err)
	}
	if s.keys[0] != s.keys[1] {
		t.Errorf("keys %q differ", s.keys)
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
		wg.Go(func() {
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
		})
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
	for attempt := 1; attempt <= 70; attempt++ {
		ceiling := min(80*time.Millisecond, 10*time.Millisecond<<min(attempt-1, 10))
		distinct := map[time.Duration]bool{}
		for range 50 {
			d := tp.backoff(attempt)
			if d < 0 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, outside [0, %v]", attempt, d, ceiling)
			}
			distinct[d] = true
		}
		if len(distinct) < 2 {
			t.Fatalf("backoff(%d) drew one value 50 times: no jitter", attempt)
		}
	}
}
