package httpcheck

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/atonce"
)

// TwoInstances serves handler behind idemhttp (one key space shared by
// every caller) on two servers, each over its own engine from newEngine,
// as two instances of an application over one store; and returns them
// with a client that keeps enough connections open for a burst.
func TwoInstances(t testing.TB, newEngine func(t testing.TB) *idem.Engine, handler http.Handler) ([2]*httptest.Server, *http.Client) {
	t.Helper()
	var servers [2]*httptest.Server
	for i := range servers {
		mw, err := idemhttp.NewMiddleware(newEngine(t), &idemhttp.Config{SharedKeySpace: true})
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = httptest.NewServer(mw.Handler(handler))
		t.Cleanup(servers[i].Close)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(client.CloseIdleConnections)
	return servers, client
}

// PostOrderAtOnce sends n identical POST /orders (body "42", key
// order-42), released by one barrier and spread over servers, and returns
// each answer, or the error that stood for it.
func PostOrderAtOnce(servers [2]*httptest.Server, client *http.Client, n int) ([]Answer, []error) {
	answers, errs := make([]Answer, n), make([]error, n)
	atonce.Run(n, func(i int) {
		answers[i], errs[i] = postOrder(client, servers[i%2])
	})
	return answers, errs
}

func postOrder(client *http.Client, srv *httptest.Server) (Answer, error) {
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader("42"))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set(idemhttp.HeaderKey, "order-42")
	resp, err := client.Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return Answer{resp.StatusCode, resp.Header, string(body)}, err
}

// SameKeyAtTheSameInstant checks a store through HTTP: two servers (two
// application instances, each with its own engine and client) over one
// store, and n identical POSTs with one key, released by one barrier and
// spread over both, run the handler exactly once. Every other answer is
// the byte-identical replay or a 409 in flight; a retry after the
// completion gets the replay.
func SameKeyAtTheSameInstant(t *testing.T, n int, newEngine func(t testing.TB) *idem.Engine) {
	t.Helper()
	var runs atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		time.Sleep(10 * time.Millisecond) // let the duplicates meet the key in flight
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"order":`+string(body)+`,"run":`+strconv.Itoa(int(n))+`}`)
	})
	servers, client := TwoInstances(t, newEngine, handler)
	answers, errs := PostOrderAtOnce(servers, client, n)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", got)
	}
	const want = `{"order":42,"run":1}`
	var fresh, replayed, inFlight int
	for i, a := range answers {
		marker := a.Header.Get(idemhttp.HeaderReplayed)
		switch {
		case a.Status == http.StatusCreated && marker == "" && a.Body == want:
			fresh++
		case a.Status == http.StatusCreated && marker == "true" && a.Body == want:
			replayed++
		case a.Status == http.StatusConflict:
			inFlight++
		default:
			t.Fatalf("answer %d: %d, replayed %q, %s", i, a.Status, marker, a.Body)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d fresh answers, want 1 (%d replayed, %d in flight)", fresh, replayed, inFlight)
	}
	t.Logf("1 fresh, %d replayed, %d in flight", replayed, inFlight)

	// A retry after the completion gets the replay.
	a, err := postOrder(client, servers[1])
	if err != nil {
		t.Fatal(err)
	}
	if a.Status != http.StatusCreated || a.Header.Get(idemhttp.HeaderReplayed) != "true" || a.Body != want {
		t.Fatalf("retry after completion: %d %q %s", a.Status, a.Header.Get(idemhttp.HeaderReplayed), a.Body)
	}
}
