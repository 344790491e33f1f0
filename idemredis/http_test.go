package idemredis

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/testenv"
)

// TestHTTPSameKeyAtTheSameInstant: two HTTP servers (two app instances,
// each with its own Redis client) share one prefix; 50 identical POSTs
// with one key, released by one barrier and spread over both, run the
// handler exactly once. Every other answer is the byte-identical replay
// or a 409 in flight.
func TestHTTPSameKeyAtTheSameInstant(t *testing.T) {
	prefix := testenv.Name()
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
		engine, err := idem.NewEngine(newStoreOn(t, newClient(t, -1), prefix), nil)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = httptest.NewServer(mw.Handler(handler))
		t.Cleanup(servers[i].Close)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)

	const n = 50
	type answer struct {
		status   int
		replayed string
		body     string
	}
	answers := make([]answer, n)
	b := newBarrier(n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, servers[i%2].URL+"/orders", strings.NewReader("42"))
			if err != nil {
				t.Error(err)
				return
			}
			req.Header.Set(idemhttp.HeaderKey, "order-42")
			b.wait()
			resp, err := client.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			answers[i] = answer{resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), string(body)}
		})
	}
	b.release()
	wg.Wait()
	if t.Failed() {
		return
	}

	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", got)
	}
	const want = `{"order":42,"run":1}`
	var fresh, replayed, inFlight int
	for i, a := range answers {
		switch {
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
}

// TestHTTPUnreachableFailsClosed: with Redis unreachable, a request with a
// key is answered 503 and the handler does not run.
func TestHTTPUnreachableFailsClosed(t *testing.T) {
	store, err := NewStore(unreachableClient(t), &Config{Logger: (&logBuffer{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	engine, err := idem.NewEngine(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: (&logBuffer{}).logger()})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader("42"))
	req.Header.Set(idemhttp.HeaderKey, "order-42")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || runs.Load() != 0 {
		t.Fatalf("answer %d after %d runs, want 503 and no run", rec.Code, runs.Load())
	}
}
