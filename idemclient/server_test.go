package idemclient_test

// The Transport against idemhttp servers: lost answers, slow and crashed
// executions, redirects between nodes that share one store. Each test
// counts the handler's executions on the server side.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/stripeserver"
)

func TestIdemclientLostResponse(t *testing.T) {
	c := &stripeserver.Customers{}
	srv, a := stripeserver.LostFirstResponse(t, c)
	base := srv.Client().Transport
	client := idemclient.NewClient(&idemclient.Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})

	var tr idemclient.Trace
	ctx := idemclient.WithTrace(context.Background(), &tr)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/customers",
		strings.NewReader(url.Values{"email": {"jenny@example.com"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	stripeserver.CheckOneExecution(t, c, a, 2)
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), `"id":"cus_1"`) || !tr.Replayed || tr.Attempts != 2 {
		t.Fatalf("got %s after %d attempts (replayed %v), want cus_1 replayed after 2", body, tr.Attempts, tr.Replayed)
	}
	if tr.History[0].Err == nil {
		t.Errorf("first attempt recorded as %+v, want the lost connection", tr.History[0])
	}
}

// The handler is slower than the first attempt's timeout: the client gives
// the attempt up and retries with the same key, gets 409 while the first
// execution runs, then its stored result.
func TestIdemclientSlowHandler(t *testing.T) {
	gate := make(chan struct{})
	c := &stripeserver.Customers{Gate: gate}
	eng, err := idem.NewEngine(idemmem.NewStore(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The server lets the execution finish after its client gave up (the
	// way Stripe works), so the retry meets it in flight rather than
	// running the operation again.
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &stripeserver.Attempts{}
	var once sync.Once
	a.OnStatus = func(status int) {
		if status == http.StatusConflict {
			once.Do(func() { close(gate) }) // a retry met the running execution: let it finish
		}
	}
	srv := httptest.NewServer(a.Wrap(m.Handler(c)))
	defer srv.Close()
	defer once.Do(func() { close(gate) })

	client := idemclient.NewClient(&idemclient.Transport{
		Base:           srv.Client().Transport,
		AttemptTimeout: 200 * time.Millisecond,
		MaxAttempts:    10,
		BaseDelay:      time.Millisecond,
		MaxDelay:       10 * time.Millisecond,
	})
	var tr idemclient.Trace
	ctx, cancel := context.WithTimeout(idemclient.WithTrace(context.Background(), &tr), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL,
		strings.NewReader(url.Values{"email": {"slow@example.com"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if n := c.Executions.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	if !strings.Contains(string(body), `"id":"cus_1"`) || !tr.Replayed {
		t.Fatalf("got %d %s (replayed %v), want cus_1 replayed", resp.StatusCode, body, tr.Replayed)
	}
	var statuses []int
	for _, at := range tr.History {
		statuses = append(statuses, at.Status)
	}
	if !errors.Is(tr.History[0].Err, idemclient.ErrAttemptTimeout) || !slices.Contains(statuses, http.StatusConflict) {
		t.Fatalf("history %+v: want a timed-out first attempt, then 409s, then the replay", tr.History)
	}
	keys, _ := a.Snapshot()
	for _, k := range keys {
		if k != tr.Key {
			t.Fatalf("keys sent %q, want %q on every attempt", keys, tr.Key)
		}
	}
}

// keyLog records the Idempotency-Key of every request a server received.
type keyLog struct {
	mu   sync.Mutex
	keys []string
}

func (l *keyLog) add(r *http.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keys = append(l.keys, r.Header.Get(idemhttp.HeaderKey))
	return len(l.keys)
}

func (l *keyLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.keys...)
}

// idemNode is one server of a cluster whose nodes share store: its own
// engine and middleware in front of h.
func idemNode(t *testing.T, store idem.Store, h http.Handler) http.Handler {
	t.Helper()
	eng, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close(context.Background()) })
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/customers", m.Handler(h))
	return mux
}

// Two nodes share one store. Node A runs the operation and commits, but
// its answer is lost; the retry reaches A, which sends it on to node B
// with a 307 or 308 (A is draining, say). http.Client builds the
// redirected request from the caller's original, which never carried the
// key the Transport made: B must still get that key, find the committed
// result, and replay it, not run the operation a second time.
func TestRedirectCarriesTheKey(t *testing.T) {
	cases := []struct {
		name      string
		status    int
		callerKey string
	}{
		{"307", http.StatusTemporaryRedirect, ""},
		{"308", http.StatusPermanentRedirect, ""},
		{"307, the caller's key", http.StatusTemporaryRedirect, "caller-key-1"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			store := idemmem.NewStore(nil)
			cus := &stripeserver.Customers{}
			var seenA, seenB keyLog
			b := idemNode(t, store, cus)
			nodeB := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				seenB.add(r)
				b.ServeHTTP(w, r)
			}))
			t.Cleanup(nodeB.Close)
			a := idemNode(t, store, cus)
			nodeA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if seenA.add(r) > 1 {
					http.Redirect(w, r, nodeB.URL+r.URL.Path, c.status)
					return
				}
				rec := httptest.NewRecorder()
				a.ServeHTTP(rec, r)
				if rec.Code != http.StatusOK || !stripeserver.Lose(w) {
					t.Errorf("node A answered %d, or could not drop the answer", rec.Code)
				}
			}))
			t.Cleanup(nodeA.Close)

			base := &http.Transport{}
			t.Cleanup(base.CloseIdleConnections)
			client := idemclient.NewClient(&idemclient.Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})
			var tr idemclient.Trace
			req, err := http.NewRequestWithContext(idemclient.WithTrace(context.Background(), &tr), http.MethodPost,
				nodeA.URL+"/v1/customers", strings.NewReader(url.Values{"email": {"jenny@example.com"}}.Encode()))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if c.callerKey != "" {
				req.Header.Set(idemhttp.HeaderKey, c.callerKey)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)

			keysA, keysB := seenA.snapshot(), seenB.snapshot()
			if n := cus.Executions.Load(); n != 1 {
				t.Fatalf("the handler ran %d times, want 1 (keys at node A %q, at node B %q)", n, keysA, keysB)
			}
			want := tr.Key
			if c.callerKey != "" && want != c.callerKey {
				t.Fatalf("Trace.Key %q, want the caller's %q", want, c.callerKey)
			}
			if len(keysA) != 2 || len(keysB) != 1 {
				t.Fatalf("node A got %d requests, node B %d; want 2 and 1", len(keysA), len(keysB))
			}
			for _, k := range append(keysA, keysB...) {
				if k != want {
					t.Fatalf("keys at node A %q, at node B %q; want %q everywhere", keysA, keysB, want)
				}
			}
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"id":"cus_1"`) || !tr.Replayed {
				t.Fatalf("got %d %s (replayed %v), want node A's cus_1 replayed by node B", resp.StatusCode, body, tr.Replayed)
			}
			var statuses []int
			for _, at := range tr.History {
				statuses = append(statuses, at.Status)
			}
			if fmt.Sprint(statuses) != fmt.Sprintf("[0 %d 200]", c.status) || tr.Attempts != 3 {
				t.Fatalf("trace: %d attempts, statuses %v; want the lost answer, the redirect and the replay", tr.Attempts, statuses)
			}
		})
	}
}

// TestInFlightOutlivesACrashedHolder: the first attempt reaches a server
// that charges the card and then dies (its connection drops, its execution
// never ends). Every retry meets the dead execution's claim, 409, until its
// lease ends on the store's clock; then a retry takes the key over and
// gets an answer. With the server's default lease (90s), the client must
// keep asking longer than its attempt budget for failures lasts: 409s are
// bounded by InFlightTimeout (2 minutes by default), not by MaxAttempts.
//
// The store's clock is the test's: it moves past the lease once the server
// has answered more 409s than MaxAttempts, so the test does not wait 90s.
// The server sends no Retry-After, so the retries follow the Transport's
// own (short) backoff.
func TestInFlightOutlivesACrashedHolder(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	store := idemmem.NewStore(&idemmem.Config{NowFunc: clock})
	// The default lease; no heartbeat, as nobody extends a dead process's
	// lease.
	eng, err := idem.NewEngine(store, &idem.Config{Heartbeat: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var charges atomic.Int32
	charged := make(chan struct{})
	dead := make(chan struct{}) // the dead execution's goroutine waits here until the test ends
	t.Cleanup(func() { close(dead) })
	protected := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if charges.Add(1) == 1 {
			close(charged)
			<-dead
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"id":"ch_2"}`)
	}))
	const conflictsBeforeLeaseEnd = idemclient.DefaultMaxAttempts + 3
	var keys keyLog
	var conflicts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if keys.add(r) == 1 {
			// The execution goes on in a goroutine of its own, on a
			// recorder nobody reads; the client's connection dies once
			// the card is charged.
			go protected.ServeHTTP(httptest.NewRecorder(), r.WithContext(context.WithoutCancel(r.Context())))
			<-charged
			stripeserver.Lose(w)
			return
		}
		rec := httptest.NewRecorder()
		protected.ServeHTTP(rec, r)
		if rec.Code == http.StatusConflict {
			rec.Header().Del("Retry-After")
			if conflicts.Add(1) == conflictsBeforeLeaseEnd {
				mu.Lock()
				now = now.Add(idem.DefaultLease + time.Second)
				mu.Unlock()
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(srv.Close)

	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	client := idemclient.NewClient(&idemclient.Transport{Base: base, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})
	var tr idemclient.Trace
	ctx, cancel := context.WithTimeout(idemclient.WithTrace(context.Background(), &tr), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", strings.NewReader("amount=1900"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || !strings.Contains(string(body), "ch_2") {
		t.Fatalf("got %d %s after %d attempts (%d answered 409), want the 201 of the retry that took the dead execution's key over",
			resp.StatusCode, body, tr.Attempts, conflicts.Load())
	}
	if got := int(conflicts.Load()); tr.Attempts != got+2 {
		t.Fatalf("%d attempts, want 1 lost, %d answered 409, 1 answered 201", tr.Attempts, got)
	}
	for _, k := range keys.snapshot() {
		if k != tr.Key {
			t.Fatalf("keys sent %q, want %q on every attempt", keys.snapshot(), tr.Key)
		}
	}
}

// The client's budget for 409s must outlive the server's lease, or a
// client whose first attempt died with the server's process gives up
// before the dead execution's key can be taken over (see "Sizing the
// budgets with the server's lease" in the package documentation). The
// budget counts from the first 409, which comes after the claim, and the
// Transport sends its last retry when the budget ends: a budget longer
// than the lease is enough.
func TestDefaultBudgetOutlivesDefaultLease(t *testing.T) {
	if idemclient.DefaultInFlightTimeout <= idem.DefaultLease {
		t.Fatalf("DefaultInFlightTimeout %v does not outlive idem.DefaultLease %v", idemclient.DefaultInFlightTimeout, idem.DefaultLease)
	}
}

// A 409 from idemhttp carries Retry-After (idemhttp.Config.RetryAfter, 1s by
// default): the Transport waits that long before it asks again, though
// its own backoff would have asked within milliseconds, and then gets the
// stored answer.
func TestInFlightFollowsRetryAfter(t *testing.T) {
	started, gate := make(chan struct{}), make(chan struct{})
	var executions atomic.Int32
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if executions.Add(1) == 1 {
			close(started)
		}
		<-gate
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"ch_1"}`)
	})
	eng, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if idemhttp.DefaultRetryAfter != time.Second {
		t.Fatalf("idemhttp.DefaultRetryAfter %v, want 1s", idemhttp.DefaultRetryAfter)
	}
	m, err := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var arrived []time.Time
	var once sync.Once
	defer once.Do(func() { close(gate) })
	a := &stripeserver.Attempts{OnStatus: func(status int) {
		if status == http.StatusConflict {
			once.Do(func() { close(gate) }) // the execution may finish now
		}
	}}
	inner := a.Wrap(m.Handler(slow))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived = append(arrived, time.Now())
		mu.Unlock()
		inner.ServeHTTP(w, r)
	}))
	defer srv.Close()

	const key = "charge-ra-1"
	post := func(ctx context.Context, client *http.Client) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("amount=1900"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set(idemhttp.HeaderKey, key)
		return client.Do(req)
	}
	firstDone := make(chan error, 1)
	go func() {
		resp, err := post(context.Background(), srv.Client())
		if err == nil {
			resp.Body.Close()
		}
		firstDone <- err
	}()
	<-started

	client := idemclient.NewClient(&idemclient.Transport{Base: srv.Client().Transport, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond})
	var tr idemclient.Trace
	resp, err := post(idemclient.WithTrace(context.Background(), &tr), client)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := <-firstDone; err != nil {
		t.Fatalf("first request: %v", err)
	}
	if resp.StatusCode != http.StatusOK || !tr.Replayed || string(body) != `{"id":"ch_1"}` || executions.Load() != 1 {
		t.Fatalf("got %d %s (replayed %v, %d executions), want the first execution's answer replayed", resp.StatusCode, body, tr.Replayed, executions.Load())
	}
	if len(tr.History) != 2 || tr.History[0].Status != http.StatusConflict {
		t.Fatalf("history %+v, want a 409 then the replay", tr.History)
	}
	if w := tr.History[0].Wait; w < time.Second {
		t.Errorf("paused %v after the 409, want its Retry-After (1s)", w)
	}
	mu.Lock()
	defer mu.Unlock()
	// arrived: the first request, the 409, the replay.
	if len(arrived) != 3 || arrived[2].Sub(arrived[1]) < time.Second {
		t.Errorf("requests arrived at %v; want the retry at least 1s after the 409", arrived)
	}
}
