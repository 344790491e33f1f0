package idemprom_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
)

// Wiring idemprom: one Collector as the tracer of the engine, the janitor
// and the client, and GET /metrics from promhttp.
func Example() {
	store := idemmem.NewStore(nil)
	metrics, err := idemprom.NewCollector(nil) // registers with prometheus.DefaultRegisterer
	if err != nil {
		log.Fatal(err)
	}
	engine, _ := idem.NewEngine(store, &idem.Config{Tracer: metrics})
	janitor, _ := idemjanitor.NewJanitor(store, &idemjanitor.Config{Tracer: metrics})
	go janitor.Run(context.Background()) //nolint:errcheck // returns when its context ends
	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))
	mux.Handle("GET /metrics", promhttp.Handler())
	client := idemclient.NewClient(&idemclient.Transport{Tracer: metrics}) // for calls to other services
	_ = client

	// What a scrape shows after one request.
	srv := httptest.NewServer(mux)
	defer srv.Close()
	resp, _ := http.Post(srv.URL+"/orders", "application/json", strings.NewReader(`{}`)) // no key: passes through
	resp.Body.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "order-1")
	resp, _ = http.DefaultClient.Do(req)
	resp.Body.Close()
	resp, _ = http.Get(srv.URL + "/metrics")
	text, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(line, "idem_requests_total") && !strings.HasSuffix(line, " 0") {
			fmt.Println(line)
		}
	}
	// Output:
	// idem_requests_total{method="POST",outcome="executed",route="/orders"} 1
	// idem_requests_total{method="POST",outcome="passthrough",route="/orders"} 1
}

func createOrder(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ord_1"}`) //nolint:errcheck
}
