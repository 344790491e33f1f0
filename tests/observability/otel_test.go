package observability

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/internal/obsload"
)

// TestOtelAndPrometheusTogether runs the workload on each real store
// with idemprom and idemotel combined by idem.MultiTracer: the spans
// (one per request, with its outcome; one per claim, child of its
// request's), OpenTelemetry's counters and Prometheus's all say what
// happened.
func TestOtelAndPrometheusTogether(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			prom, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			spans := tracetest.NewSpanRecorder()
			reader := sdkmetric.NewManualReader()
			otelTracer, err := idemotel.New(&idemotel.Config{
				TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
				MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
			})
			if err != nil {
				t.Fatal(err)
			}
			engine, err := idem.NewEngine(st.open(t), &idem.Config{Tracer: idem.MultiTracer(prom, otelTracer), Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer engine.Close(context.Background())
			mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			w := &obsload.Workload{Fresh: 8, Replays: 6, Duplicates: 5, Prefix: "multi"}
			mux := http.NewServeMux()
			mux.Handle("POST "+obsload.Route, mw.Handler(w.App()))
			n := w.Run(t, obsload.InProcess(mux))

			var rm metricdata.ResourceMetrics
			if err := reader.Collect(context.Background(), &rm); err != nil {
				t.Fatal(err)
			}
			otelRequests := map[string]int64{}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idem.requests" {
						for _, p := range sum.DataPoints {
							v, _ := p.Attributes.Value(idemotel.KeyOutcome)
							otelRequests[v.AsString()] += p.Value
						}
					}
				}
			}
			spanOutcomes := map[string]int{}
			requestSpans := map[trace.SpanID]bool{}
			for _, s := range spans.Ended() {
				if s.Name() != "idem.request" {
					continue
				}
				requestSpans[s.SpanContext().SpanID()] = true
				for _, a := range s.Attributes() {
					if a.Key == idemotel.KeyOutcome {
						spanOutcomes[a.Value.AsString()]++
					}
					if a.Key == idemotel.KeyStore && a.Value != attribute.StringValue(st.name) {
						t.Errorf("idem.store = %s, want %s", a.Value.AsString(), st.name)
					}
				}
			}
			claims := 0
			for _, s := range spans.Ended() {
				if s.Name() == "idem.store.claim" && requestSpans[s.Parent().SpanID()] {
					claims++
				}
			}
			scraped := gather(t, reg)
			for outcome, want := range map[string]int{
				"executed": n.Executed, "replayed": n.Replayed, "in_flight": n.InFlight, "fingerprint_mismatch": n.FingerprintMismatch,
			} {
				if spanOutcomes[outcome] != want || otelRequests[outcome] != int64(want) {
					t.Errorf("%s: %d spans, idem.requests %d, want %d", outcome, spanOutcomes[outcome], otelRequests[outcome], want)
				}
				if got := scraped["idem_requests_total{method=POST,outcome="+outcome+",route=/orders}"]; got != float64(want) {
					t.Errorf("%s: idem_requests_total %v, want %d", outcome, got, want)
				}
			}
			if claims != n.Claims {
				t.Errorf("%d claim spans under request spans, want %d", claims, n.Claims)
			}
		})
	}
}
