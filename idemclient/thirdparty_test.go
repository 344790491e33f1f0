package idemclient_test

// Real retrying clients against an idem-protected handler whose first
// response is lost after the commit: each must end with exactly one
// execution and the original answer. Each test fails if the server runs
// the operation twice.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	retryablehttp "github.com/hashicorp/go-retryablehttp"
	"github.com/stripe/stripe-go/v82"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// customers is a Stripe-shaped POST /v1/customers (form-encoded) that
// counts its executions.
type customers struct {
	executions atomic.Int32
	// gate, when set, is waited for before answering: a slow handler.
	gate chan struct{}
}

func (c *customers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	n := c.executions.Add(1)
	if c.gate != nil {
		// Slow on purpose, and deaf to the request's end: the work goes on
		// after the client gave the attempt up.
		<-c.gate
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Request-Id", fmt.Sprintf("req_%d", n))
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("cus_%d", n), "object": "customer",
		"email": r.PostForm.Get("email"), "name": r.PostForm.Get("name"),
	})
}

// attempts records what reached the server (outside idemhttp): the key of
// each request and the status the middleware answered.
type attempts struct {
	loseFirst bool // drop the first response after the commit
	mu        sync.Mutex
	keys      []string
	statuses  []int
	onStatus  func(int)
}

func (a *attempts) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		a.mu.Lock()
		a.keys = append(a.keys, r.Header.Get(idemhttp.HeaderKey))
		a.statuses = append(a.statuses, rec.Code)
		onStatus := a.onStatus
		first := len(a.keys) == 1
		a.mu.Unlock()
		if onStatus != nil {
			onStatus(rec.Code)
		}
		if first && a.loseFirst && lose(w) {
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

func (a *attempts) snapshot() ([]string, []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...), append([]int(nil), a.statuses...)
}

// lose drops the connection instead of answering: the handler ran and
// idemhttp committed, but the client never hears of it.
func lose(w http.ResponseWriter) bool {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	_ = conn.Close()
	return true
}

// lostFirstResponse serves h behind idemhttp over idemmem; the first
// response is lost after the commit.
func lostFirstResponse(t *testing.T, h http.Handler) (*httptest.Server, *attempts) {
	t.Helper()
	eng, err := idem.NewEngine(idemmem.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := idemhttp.New(idemhttp.Config{Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	a := &attempts{loseFirst: true}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/customers", m.Handler(h))
	srv := httptest.NewServer(a.wrap(mux))
	t.Cleanup(srv.Close)
	return srv, a
}

// checkOneExecution asserts the scenario's outcome from the server side.
func checkOneExecution(t *testing.T, c *customers, a *attempts, wantAttempts int) {
	t.Helper()
	if n := c.executions.Load(); n != 1 {
		t.Fatalf("the handler ran %d times, want 1", n)
	}
	keys, statuses := a.snapshot()
	if len(keys) != wantAttempts {
		t.Fatalf("%d requests reached the server (statuses %v), want %d", len(keys), statuses, wantAttempts)
	}
	for i, k := range keys {
		if k == "" || k != keys[0] {
			t.Fatalf("request %d carried key %q; all must carry the first one, %q", i+1, k, keys[0])
		}
	}
}

func TestStripeGoRetryGetsOriginalCustomer(t *testing.T) {
	c := &customers{}
	srv, a := lostFirstResponse(t, c)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		HTTPClient:        srv.Client(),
		MaxNetworkRetries: stripe.Int64(2),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient("sk_test_idem", stripe.WithBackends(&stripe.Backends{API: backend, Connect: backend, Uploads: backend}))

	cus, err := sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{
		Email: stripe.String("jenny@example.com"), Name: stripe.String("Jenny Rosen"),
	})
	if err != nil {
		t.Fatal(err)
	}
	checkOneExecution(t, c, a, 2)
	if cus.ID != "cus_1" || cus.Email != "jenny@example.com" {
		t.Fatalf("customer %s <%s>, want the original cus_1 <jenny@example.com>", cus.ID, cus.Email)
	}
	if cus.LastResponse == nil || cus.LastResponse.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatal("the retry's answer is not marked as a replay")
	}
	if cus.LastResponse.IdempotencyKey == "" {
		t.Fatal("stripe-go sent no Idempotency-Key of its own")
	}
}

func TestRetryableHTTPWithKeySetOnce(t *testing.T) {
	c := &customers{}
	srv, a := lostFirstResponse(t, c)
	rc := retryablehttp.NewClient()
	rc.HTTPClient = srv.Client()
	rc.RetryMax = 3
	rc.RetryWaitMin, rc.RetryWaitMax = time.Millisecond, 10*time.Millisecond
	rc.Logger = nil

	form := url.Values{"email": {"jenny@example.com"}}.Encode()
	req, err := retryablehttp.NewRequest(http.MethodPost, srv.URL+"/v1/customers", strings.NewReader(form))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set(idemhttp.HeaderKey, uuid.NewString()) // once, for all its retries
	resp, err := rc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checkOneExecution(t, c, a, 2)
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"id":"cus_1"`) ||
		resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("got %d %s (replayed %q), want the original cus_1 replayed", resp.StatusCode, body, resp.Header.Get(idemhttp.HeaderReplayed))
	}
}

func TestIdemclientLostResponse(t *testing.T) {
	c := &customers{}
	srv, a := lostFirstResponse(t, c)
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
	checkOneExecution(t, c, a, 2)
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
	c := &customers{gate: gate}
	eng, err := idem.NewEngine(idemmem.New(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The server lets the execution finish after its client gave up (the
	// way Stripe works), so the retry meets it in flight rather than
	// running the operation again.
	m, err := idemhttp.New(idemhttp.Config{Engine: eng, FinishAfterDisconnect: true})
	if err != nil {
		t.Fatal(err)
	}
	a := &attempts{}
	var once sync.Once
	a.onStatus = func(status int) {
		if status == http.StatusConflict {
			once.Do(func() { close(gate) }) // a retry met the running execution: let it finish
		}
	}
	srv := httptest.NewServer(a.wrap(m.Handler(c)))
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
	if n := c.executions.Load(); n != 1 {
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
	keys, _ := a.snapshot()
	for _, k := range keys {
		if k != tr.Key {
			t.Fatalf("keys sent %q, want %q on every attempt", keys, tr.Key)
		}
	}
}
