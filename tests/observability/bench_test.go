package observability

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/idemprom"
)

// The overhead benchmarks: idemhttp over the memory store, in process,
// with no tracer, with idemprom, and with idemotel (sampled and not).
//
//	go test -run '^$' -bench 'Observe' -benchmem -count 6 ./observability/

const benchBody = `{"amount":1200,"currency":"eur","customer":"cus_123"}`

var benchApp = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body) //nolint:errcheck
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ord_1","amount":1200,"currency":"eur"}`) //nolint:errcheck
})

// cpuTime returns the CPU time the process has used, GC included.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ns/op: on a shared machine ns/op counts the time
// spent waiting for a core too; the process's CPU time does not.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

// benchKeys is how many fresh keys run before the store starts over, as
// in idemhttp's own benchmarks.
const benchKeys = 1 << 12

// tracers are the variants measured; each returns nil for "off".
var tracers = []struct {
	name string
	make func(b *testing.B) idem.Tracer
}{
	{"off", func(*testing.B) idem.Tracer { return nil }},
	{"idemprom", func(b *testing.B) idem.Tracer {
		c, err := idemprom.NewCollector(&idemprom.Config{Registerer: prometheus.NewRegistry()})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}},
	{"idemotel-sampled", func(b *testing.B) idem.Tracer { return benchOtel(b, sdktrace.AlwaysSample()) }},
	{"idemotel-unsampled", func(b *testing.B) idem.Tracer { return benchOtel(b, sdktrace.NeverSample()) }},
}

// benchOtel is idemotel on the SDK as a service would run it: spans
// batched to an exporter (one that drops them), metrics aggregated for a
// reader.
func benchOtel(b *testing.B, sampler sdktrace.Sampler) idem.Tracer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { tp.Shutdown(context.Background()) }) //nolint:errcheck
	tr, err := idemotel.New(&idemotel.Config{
		TracerProvider: tp,
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())),
	})
	if err != nil {
		b.Fatal(err)
	}
	return tr
}

func benchHandler(b *testing.B, store idem.Store, tr idem.Tracer) http.Handler {
	engine, err := idem.NewEngine(store, &idem.Config{Tracer: tr, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(benchApp))
	return mux
}

// BenchmarkObserveFirstExecution: a fresh key each time.
func BenchmarkObserveFirstExecution(b *testing.B) {
	for _, tc := range tracers {
		b.Run(tc.name, func(b *testing.B) {
			tr := tc.make(b)
			keys := make([]string, benchKeys)
			for i := range keys {
				keys[i] = "key-" + strconv.Itoa(i)
			}
			body := strings.NewReader(benchBody)
			r := httptest.NewRequest(http.MethodPost, "/orders", body)
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			h := benchHandler(b, idemmem.NewStore(nil), tr)
			i := 0
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if i == len(keys) {
					b.StopTimer()
					h = benchHandler(b, idemmem.NewStore(nil), tr)
					i = 0
					b.StartTimer()
				}
				r.Header["Idempotency-Key"] = keys[i : i+1]
				i++
				body.Reset(benchBody)
				w.Body.Reset()
				clear(w.Header())
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}

// BenchmarkObserveReplay: the same key each time, after its execution.
func BenchmarkObserveReplay(b *testing.B) {
	for _, tc := range tracers {
		b.Run(tc.name, func(b *testing.B) {
			h := benchHandler(b, idemmem.NewStore(nil), tc.make(b))
			body := strings.NewReader(benchBody)
			r := httptest.NewRequest(http.MethodPost, "/orders", body)
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", "replayed-key")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				body.Reset(benchBody)
				w.Body.Reset()
				clear(w.Header())
				h.ServeHTTP(w, r)
				if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
					b.Fatalf("status %d", w.Code)
				}
			}
		})
	}
}
