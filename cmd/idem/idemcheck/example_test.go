package idemcheck_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/idemcheck"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

func ExampleCheck() {
	// An orders endpoint protected by idemhttp.
	var o orders
	eng, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	m, _ := idemhttp.NewMiddleware(eng, &idemhttp.Config{SharedKeySpace: true})
	srv := httptest.NewServer(o.mux(m.Handler(http.HandlerFunc(o.create))))
	defer srv.Close()

	rep, err := idemcheck.Check(context.Background(), idemcheck.Config{
		URL:      srv.URL + "/orders",
		Body:     []byte(`{"cart_id":"c_42","total_cents":1900}`),
		Header:   http.Header{"Content-Type": {"application/json"}},
		CountURL: srv.URL + "/orders?cart_id=c_42",
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range rep.Results {
		fmt.Println(r.ID, r.Name, r.Status)
	}
	fmt.Println("passed:", rep.Passed)
	// Output:
	// 1 concurrent duplicates pass
	// 2 retry after completion pass
	// 3 same key, other body pass
	// 4 fresh key pass
	// 5 resources per key pass
	// 6 disconnect, then retry pass
	// passed: true
}

func ExampleLoad() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	rep, err := idemcheck.Load(context.Background(), idemcheck.LoadConfig{
		URL:         srv.URL,
		Body:        []byte(`{}`),
		Duration:    100 * time.Millisecond,
		Concurrency: 2,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("all created:", rep.Statuses[http.StatusCreated] == rep.Requests, "failures:", rep.Failures)
	fmt.Println("p50 ≤ p99:", rep.Latency.P50 <= rep.Latency.P99)
	// Output:
	// all created: true failures: 0
	// p50 ≤ p99: true
}
