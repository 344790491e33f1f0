package idemotel_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
)

// Wiring idemotel: one Tracer, on the global providers, as the tracer of
// the engine, the janitor and the client. The handler's spans are
// children of the request's span.
func Example() {
	spans := tracetest.NewSpanRecorder() // stands for the exporter the program sets up
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))

	store := idemmem.NewStore(nil)
	tracer, err := idemotel.New(nil) // the global TracerProvider and MeterProvider
	if err != nil {
		log.Fatal(err)
	}
	engine, _ := idem.NewEngine(store, &idem.Config{Tracer: tracer})
	janitor, _ := idemjanitor.NewJanitor(store, &idemjanitor.Config{Tracer: tracer})
	go janitor.Run(context.Background()) //nolint:errcheck // returns when its context ends
	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true})
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(http.HandlerFunc(createOrder)))
	client := idemclient.NewClient(&idemclient.Transport{Tracer: tracer}) // for calls to other services
	_ = client

	for range 2 {
		r := httptest.NewRequest("POST", "/orders", strings.NewReader(`{}`))
		r.Header.Set("Idempotency-Key", "order-1")
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}
	for _, s := range spans.Ended() {
		if s.Name() == "idem.purge" {
			continue // the janitor's pass, whenever it comes
		}
		line := s.Name()
		for _, a := range s.Attributes() {
			if a.Key == idemotel.KeyOutcome {
				line += " " + a.Value.AsString()
			}
		}
		if s.Parent().IsValid() {
			line = "  " + line
		}
		fmt.Println(line)
	}
	// Output:
	//   idem.store.claim
	//   idem.store.begin
	//   insert order
	//   idem.store.complete
	// idem.request executed
	//   idem.store.claim
	// idem.request replayed
}

func createOrder(w http.ResponseWriter, r *http.Request) {
	_, span := otel.Tracer("orders").Start(r.Context(), "insert order")
	defer span.End()
	w.WriteHeader(http.StatusCreated)
}
