package idemclient_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemclient"
)

func Example() {
	// A server that is briefly unavailable, then creates the order.
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client := idemclient.NewClient(&idemclient.Transport{MaxAttempts: 3, AttemptTimeout: 5 * time.Second})

	var tr idemclient.Trace
	ctx := idemclient.WithTrace(context.Background(), &tr)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/orders",
		strings.NewReader(`{"cart_id":"c_42","total_cents":1900}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	fmt.Println(resp.Status, "after", tr.Attempts, "attempts with one key:", tr.Key != "")
	// Output: 201 Created after 2 attempts with one key: true
}
