package idemdynamo_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/atonce"
)

// TestHTTPSameKeyAtTheSameInstant: two HTTP servers (two app instances,
// each with its own DynamoDB client) share one table on dynalite; 40
// identical POSTs with one key, released by one barrier and spread over
// both, run the handler exactly once. Every other answer is the
// byte-identical replay or a 409 in flight.
func TestHTTPSameKeyAtTheSameInstant(t *testing.T) {
	endpoint := dynaliteEndpoint(t)
	table := newTable(t, endpoint)
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		time.Sleep(10 * time.Millisecond) // let the duplicates meet the key in flight
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":`+string(body)+`,"run":`+strconv.Itoa(int(n))+`}`)
	})
	var servers [2]*httptest.Server
	for i := range servers {
		engine := newEngine(t, newStore(t, endpoint, table, noSkew), nil)
		mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = httptest.NewServer(mw.Handler(handler))
		t.Cleanup(servers[i].Close)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)

	const n = 40
	type answer struct {
		status   int
		replayed string
		body     string
		err      error
	}
	answers := make([]answer, n)
	atonce.Run(n, func(i int) {
		req, err := http.NewRequest(http.MethodPost, servers[i%2].URL+"/orders", strings.NewReader("42"))
		if err != nil {
			answers[i].err = err
			return
		}
		req.Header.Set(idemhttp.HeaderKey, "order-42")
		resp, err := client.Do(req)
		if err != nil {
			answers[i].err = err
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		answers[i] = answer{resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), string(body), nil}
	})
	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", got)
	}
	const want = `{"order":42,"run":1}`
	var fresh, replayed, inFlight int
	for i, a := range answers {
		switch {
		case a.err != nil:
			t.Fatalf("request %d: %v", i, a.err)
		case a.status == http.StatusCreated && a.replayed == "" && a.body == want:
			fresh++
		case a.status == http.StatusCreated && a.replayed == "true" && a.body == want:
			replayed++
		case a.status == http.StatusConflict:
			inFlight++
		default:
			t.Fatalf("answer %d: %+v", i, a)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d fresh answers, want 1 (%d replayed, %d in flight)", fresh, replayed, inFlight)
	}
	t.Logf("1 fresh, %d replayed, %d in flight", replayed, inFlight)

	// A retry after the completion gets the replay.
	req, _ := http.NewRequest(http.MethodPost, servers[1].URL+"/orders", strings.NewReader("42"))
	req.Header.Set(idemhttp.HeaderKey, "order-42")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || resp.Header.Get(idemhttp.HeaderReplayed) != "true" || string(body) != want {
		t.Fatalf("retry after completion: %d %q %s", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), body)
	}
}

// TestHTTPBusinessItemsCommitWithAnswer: through idemhttp on minidyn, the
// handler adds its business write (a counter incremented by one) to the
// unit of work with idemdynamo.Tx(r.Context()); 30 duplicates released at
// one barrier over two servers increment it once, and every answer is
// the first or its replay or a 409.
func TestHTTPBusinessItemsCommitWithAnswer(t *testing.T) {
	endpoint := minidynEndpoint(t)
	table, orders := newTable(t, endpoint), newOrdersTable(t, endpoint)
	cfg := noSkew
	cfg.Transactional = true
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := increment(r.Context(), orders); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		time.Sleep(10 * time.Millisecond)
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "created")
	})
	var servers [2]*httptest.Server
	for i := range servers {
		engine := newEngine(t, newStore(t, endpoint, table, cfg), nil)
		mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = httptest.NewServer(mw.Handler(handler))
		t.Cleanup(servers[i].Close)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	const n = 30
	statuses := make([]int, n)
	atonce.Run(n, func(i int) {
		req, _ := http.NewRequest(http.MethodPost, servers[i%2].URL+"/orders", strings.NewReader("42"))
		req.Header.Set(idemhttp.HeaderKey, "order-42")
		resp, err := client.Do(req)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		statuses[i] = resp.StatusCode
	})
	for i, s := range statuses {
		if s != http.StatusCreated && s != http.StatusConflict {
			t.Fatalf("answer %d: status %d", i, s)
		}
	}
	if got := counterValue(t, endpoint, orders); got != 1 {
		t.Fatalf("business counter = %d after %d duplicates, want 1", got, n)
	}
}
