package idemhttp_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// The options clients ask for: the key in X-Idempotency-Key, a JSON body
// fingerprinted in canonical form without its client timestamp, a hook
// that marks replays with a header of their own, and a handler that
// knows it runs for the first time.
func ExampleConfig_options() {
	engine, _ := idem.NewEngine(idemmem.NewStore(nil), nil)
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{
		TenantFunc: tenantOfUser,
		KeyHeader:  "X-Idempotency-Key",
		IgnoreJSON: []string{"/sent_at"}, // implies CanonicalJSON
		OnReplay: func(r *http.Request, res idem.Result, h http.Header) {
			h.Set("X-Replayed-Status", fmt.Sprint(res.Status))
		},
	})
	if err != nil {
		panic(err)
	}
	h := authenticate(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("handler runs, first execution:", idemhttp.FirstExecution(r.Context()))
		w.WriteHeader(http.StatusCreated)
	})))
	for _, body := range []string{
		`{"sku":"tea","qty":2,"sent_at":"10:00:00"}`,
		`{ "qty": 2, "sku": "tea", "sent_at": "10:00:05" }`, // the retry: reordered, a new timestamp
		`{"sku":"tea","qty":3,"sent_at":"10:00:09"}`,        // another request under the key
	} {
		r := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set("X-Idempotency-Key", "k-opts")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d replayed=%t X-Replayed-Status=%q\n", w.Code, w.Header().Get(idemhttp.HeaderReplayed) == "true", w.Header().Get("X-Replayed-Status"))
	}
	// Output:
	// handler runs, first execution: true
	// 201 replayed=false X-Replayed-Status=""
	// 201 replayed=true X-Replayed-Status="201"
	// 422 replayed=false X-Replayed-Status=""
}

// A route with a policy of its own: payments, which call a slow
// provider, wait for the execution in flight and run on an engine with a
// longer lease; the rest keep the middleware's. With chi, the derived
// middleware goes in the route's chain: r.With(payments.Handler).Post(...).
func ExampleMiddleware_With() {
	store := idemmem.NewStore(nil)
	engine, _ := idem.NewEngine(store, nil)
	slow, _ := idem.NewEngine(store, &idem.Config{Lease: 10 * time.Minute})
	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOfUser})

	p := mw.Policy() // start from the middleware's, change what the route needs
	p.Engine = slow
	p.WaitInFlight = 5 * time.Second
	payments, err := mw.With(p)
	if err != nil {
		panic(err)
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(ok))
	mux.Handle("POST /payments", payments.Handler(ok))
	fmt.Println("orders wait:", mw.Policy().WaitInFlight, "payments wait:", payments.Policy().WaitInFlight)
	fmt.Println("payments lease:", payments.Policy().Engine.Config().Lease)
	// Output:
	// orders wait: 0s payments wait: 5s
	// payments lease: 10m0s
}
