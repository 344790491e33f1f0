package observability

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemconnect/idemconnecttest"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemgrpc/idemgrpctest"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/idemprom"
)

// The RPC front ends are counted under their protocol: method "grpc" or
// "connect", the full method name as the route, in idemprom and idemotel
// alike, and their request spans carry rpc.system.
func TestRPCFrontEndsCountedByProtocol(t *testing.T) {
	for _, c := range []struct {
		protocol, route, system string
		h                       idemfronttest.Harness
	}{
		{"grpc", idemgrpctest.Method, "grpc", idemgrpctest.Harness{}},
		{"connect", idemconnecttest.Procedure, "connect_rpc", idemconnecttest.Harness{}},
	} {
		t.Run(c.protocol, func(t *testing.T) {
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
			engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: idem.MultiTracer(prom, otelTracer), Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer engine.Close(context.Background())
			client := c.h.Serve(t, engine, idemfronttest.Options{}, func(context.Context, []byte) idemfronttest.Response {
				return idemfronttest.Response{Body: []byte("ok")}
			})
			for _, want := range []idemfront.Kind{idemfront.Executed, idemfront.Replayed} {
				r, err := client.Send(t.Context(), idemfronttest.Call{Tenant: "acme", Key: "k", Body: []byte("a")})
				if err != nil || r.Kind != want {
					t.Fatalf("call: %v %v, want %v", r.Kind, err, want)
				}
			}

			scraped := gather(t, reg)
			for _, outcome := range []string{"executed", "replayed"} {
				if got := scraped["idem_requests_total{method="+c.protocol+",outcome="+outcome+",route="+c.route+"}"]; got != 1 {
					t.Errorf("idem_requests_total of %s %s: %v, want 1", c.protocol, outcome, got)
				}
			}

			var rm metricdata.ResourceMetrics
			if err := reader.Collect(context.Background(), &rm); err != nil {
				t.Fatal(err)
			}
			otelCount := map[string]int64{}
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "idem.requests" {
						for _, p := range sum.DataPoints {
							method, _ := p.Attributes.Value(idemotel.KeyMethod)
							route, _ := p.Attributes.Value(idemotel.KeyRoute)
							outcome, _ := p.Attributes.Value(idemotel.KeyOutcome)
							otelCount[method.AsString()+" "+route.AsString()+" "+outcome.AsString()] += p.Value
						}
					}
				}
			}
			for _, outcome := range []string{"executed", "replayed"} {
				if got := otelCount[c.protocol+" "+c.route+" "+outcome]; got != 1 {
					t.Errorf("idem.requests of %s %s: %d, want 1 (%v)", c.protocol, outcome, got, otelCount)
				}
			}
			systems := 0
			for _, s := range spans.Ended() {
				if s.Name() != "idem.request" {
					continue
				}
				for _, a := range s.Attributes() {
					if a.Key == idemotel.KeyRPCSystem && a.Value.AsString() == c.system {
						systems++
					}
				}
			}
			if systems != 2 {
				t.Errorf("%d request spans with rpc.system=%s, want 2", systems, c.system)
			}
		})
	}
}
