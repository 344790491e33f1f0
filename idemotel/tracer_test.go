package idemotel_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/internal/obsload"
)

var quiet = slog.New(slog.DiscardHandler)

// otelEnv is an idemotel Tracer on the real SDK: spans kept in memory,
// metrics read on demand.
type otelEnv struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	tracer *idemotel.Tracer
}

func newOtel(t *testing.T, sampler sdktrace.Sampler, cfg idemotel.Config) *otelEnv {
	t.Helper()
	e := &otelEnv{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	e.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans), sdktrace.WithSampler(sampler))
	cfg.TracerProvider = e.tp
	cfg.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(e.reader))
	tr, err := idemotel.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.tracer = tr
	return e
}

// sum returns the value of the counter name at the data point whose
// attributes include every one of attrs.
func (e *otelEnv) sum(t *testing.T, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := e.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes, attrs) {
						total += p.Value
					}
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					if has(p.Attributes, attrs) {
						total += int64(p.Count)
					}
				}
			}
		}
	}
	return total
}

func has(set attribute.Set, attrs []attribute.KeyValue) bool {
	for _, a := range attrs {
		if v, ok := set.Value(a.Key); !ok || v != a.Value {
			return false
		}
	}
	return true
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, a := range s.Attributes() {
		if a.Key == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

func (e *otelEnv) named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range e.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func serve(t *testing.T, tr idem.Tracer, tenant string, app http.Handler) http.Handler {
	t.Helper()
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: tr, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{
		TenantFunc: func(*http.Request) (string, error) { return tenant, nil }, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}", mw.Handler(app))
	return mux
}

func post(h http.Handler, target, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
	r.Header.Set(idemhttp.HeaderKey, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestRequestSpan: one span per request, carrying the outcome, the
// store, the key's hash (never the key), the route; the store calls are
// its children, and so is the span the handler starts from its request's
// context.
func TestRequestSpan(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, span := e.tp.Tracer("app").Start(r.Context(), "insert order")
		span.End()
		w.WriteHeader(http.StatusCreated)
	})
	h := serve(t, e.tracer, "acme", app)
	const key = "secret-key-123"
	if w := post(h, "/orders/7", key, "{}"); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	if w := post(h, "/orders/7", key, "{}"); w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("second: not a replay")
	}

	reqs := e.named("idem.request")
	if len(reqs) != 2 {
		t.Fatalf("%d request spans, want 2", len(reqs))
	}
	for i, s := range reqs {
		wantOutcome, wantReplayed := "executed", false
		if i == 1 {
			wantOutcome, wantReplayed = "replayed", true
		}
		for key, want := range map[attribute.Key]attribute.Value{
			idemotel.KeyOutcome:  attribute.StringValue(wantOutcome),
			idemotel.KeyReplayed: attribute.BoolValue(wantReplayed),
			idemotel.KeyStore:    attribute.StringValue("memory"),
			idemotel.KeyKeyHash:  attribute.StringValue(idemotel.KeyHash("acme", key)),
			idemotel.KeyRoute:    attribute.StringValue("/orders/{id}"),
			idemotel.KeyMethod:   attribute.StringValue("POST"),
			idemotel.KeyStatus:   attribute.IntValue(http.StatusCreated),
		} {
			if got, ok := attr(s, key); !ok || got != want {
				t.Errorf("span %d: %s = %v (set %v), want %v", i, key, got.String(), ok, want.String())
			}
		}
		if _, ok := attr(s, idemotel.KeyTenant); ok {
			t.Errorf("span %d records the tenant without RecordTenant", i)
		}
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), key) || strings.Contains(a.Value.String(), "acme") {
				t.Errorf("span %d: %s = %q holds the key or the tenant", i, a.Key, a.Value.String())
			}
		}
	}
	first := reqs[0].SpanContext()
	children := map[string]int{}
	for _, s := range e.spans.Ended() {
		if s.Parent().SpanID() == first.SpanID() {
			children[s.Name()]++
		}
	}
	for _, name := range []string{"idem.store.claim", "idem.store.begin", "idem.store.complete", "insert order"} {
		if children[name] != 1 {
			t.Errorf("children of the first request span: %v, want one %q", children, name)
		}
	}
	if n := len(e.named("idem.operation")); n != 0 {
		t.Errorf("%d operation spans besides the request spans, want none", n)
	}
	if got := e.sum(t, "idem.requests", idemotel.KeyOutcome.String("replayed"), idemotel.KeyRoute.String("/orders/{id}")); got != 1 {
		t.Errorf("idem.requests{replayed} = %d, want 1", got)
	}
}

// TestRecordTenant: the tenant is recorded when the configuration asks.
func TestRecordTenant(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{RecordTenant: true})
	h := serve(t, e.tracer, "acme", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	post(h, "/orders/1", "k", "{}")
	reqs := e.named("idem.request")
	if len(reqs) != 1 {
		t.Fatalf("%d request spans", len(reqs))
	}
	if v, ok := attr(reqs[0], idemotel.KeyTenant); !ok || v.AsString() != "acme" {
		t.Fatalf("idem.tenant = %v, %v", v.String(), ok)
	}
}

// TestWorkloadOtel: after the known workload, the counters and the spans
// say exactly what happened.
func TestWorkloadOtel(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	w := &obsload.Workload{Fresh: 6, Replays: 4, Duplicates: 5, Prefix: "otel"}
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: e.tracer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+obsload.Route, mw.Handler(w.App()))
	n := w.Run(t, obsload.InProcess(mux))
	outcomes := map[string]int{}
	for _, s := range e.named("idem.request") {
		v, _ := attr(s, idemotel.KeyOutcome)
		outcomes[v.AsString()]++
	}
	want := map[string]int{"executed": n.Executed, "replayed": n.Replayed, "in_flight": n.InFlight, "fingerprint_mismatch": n.FingerprintMismatch}
	for o, c := range want {
		if outcomes[o] != c {
			t.Errorf("%s request spans: %d, want %d (all: %v)", o, outcomes[o], c, outcomes)
		}
		if got := e.sum(t, "idem.requests", idemotel.KeyOutcome.String(o)); got != int64(c) {
			t.Errorf("idem.requests{%s} = %d, want %d", o, got, c)
		}
	}
	if got := e.sum(t, "idem.store.operation.duration", idemotel.KeyStoreOperation.String("claim"), idemotel.KeyStoreResult.String("ok")); got != int64(n.Claims) {
		t.Errorf("claims measured %d, want %d", got, n.Claims)
	}
	if got := len(e.named("idem.store.claim")); got != n.Claims {
		t.Errorf("claim spans %d, want %d", got, n.Claims)
	}
	if got := e.sum(t, "idem.in_flight"); got != 0 {
		t.Errorf("idem.in_flight = %d, want 0", got)
	}
}

// TestUnsampled: no span is recorded, the metrics are all the same.
func TestUnsampled(t *testing.T) {
	e := newOtel(t, sdktrace.NeverSample(), idemotel.Config{})
	h := serve(t, e.tracer, "acme", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	post(h, "/orders/1", "k", "{}")
	post(h, "/orders/1", "k", "{}")
	if n := len(e.spans.Ended()); n != 0 {
		t.Fatalf("%d spans recorded unsampled", n)
	}
	if got := e.sum(t, "idem.requests"); got != 2 {
		t.Fatalf("idem.requests = %d, want 2", got)
	}
}

// TestOperationSpan: an engine used directly gets a span per operation;
// a failed handler marks it as an error.
func TestOperationSpan(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: e.tracer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	engine.Do(context.Background(), idem.Operation{Key: "a"}, func(ctx context.Context) (idem.Result, error) { //nolint:errcheck
		return idem.Result{}, errors.New("declined")
	})
	ops := e.named("idem.operation")
	if len(ops) != 1 {
		t.Fatalf("%d operation spans", len(ops))
	}
	if v, _ := attr(ops[0], idemotel.KeyOutcome); v.AsString() != "handler_error" || ops[0].Status().Code != codes.Error {
		t.Fatalf("outcome %q status %v", v.AsString(), ops[0].Status())
	}
}

// TestMessageSpan: a consumer span per message; its operation reports on
// it; the action is recorded and counted.
func TestMessageSpan(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: e.tracer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "billing", Tracer: e.tracer})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(context.Context) error { return nil }
	in.Process(context.Background(), ideminbox.Message{ID: "m1", Attempt: 1, Subject: "orders"}, ok) //nolint:errcheck
	in.Process(context.Background(), ideminbox.Message{ID: "m1", Attempt: 2, Subject: "orders"}, ok) //nolint:errcheck
	msgs := e.named("idem.message")
	if len(msgs) != 2 {
		t.Fatalf("%d message spans", len(msgs))
	}
	for i, want := range []string{"ack", "ack-duplicate"} {
		if v, _ := attr(msgs[i], idemotel.KeyInboxAction); v.AsString() != want || msgs[i].SpanKind() != trace.SpanKindConsumer {
			t.Errorf("message %d: action %q kind %v, want %q consumer", i, v.AsString(), msgs[i].SpanKind(), want)
		}
	}
	if v, _ := attr(msgs[1], idemotel.KeyReplayed); !v.AsBool() {
		t.Error("the duplicate's span does not say replayed")
	}
	if got := e.sum(t, "idem.inbox.messages", idemotel.KeyConsumer.String("billing"), idemotel.KeyInboxAction.String("ack-duplicate")); got != 1 {
		t.Errorf("idem.inbox.messages{ack-duplicate} = %d", got)
	}
}

// TestClientAttempts: one span per attempt, the retry carrying
// http.request.resend_count, the retry counted with its reason.
func TestClientAttempts(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	client := idemclient.NewClient(&idemclient.Transport{Tracer: e.tracer, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	attempts := e.named("idem.attempt")
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans", len(attempts))
	}
	if _, ok := attr(attempts[0], idemotel.KeyResendCount); ok {
		t.Error("the first attempt has a resend count")
	}
	if v, ok := attr(attempts[1], idemotel.KeyResendCount); !ok || v.AsInt64() != 1 {
		t.Errorf("second attempt: resend count %v %v, want 1", v.String(), ok)
	}
	if got := e.sum(t, "idem.client.retries", idemotel.KeyRetryReason.String("unavailable")); got != 1 {
		t.Errorf("retries{unavailable} = %d", got)
	}
}

// TestPurgeSpan: a span per pass with the count deleted.
func TestPurgeSpan(t *testing.T) {
	e := newOtel(t, sdktrace.AlwaysSample(), idemotel.Config{})
	j, err := idemjanitor.NewJanitor(idemmem.NewStore(nil), &idemjanitor.Config{Tracer: e.tracer, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.PurgeOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	passes := e.named("idem.purge")
	if len(passes) != 1 {
		t.Fatalf("%d purge spans", len(passes))
	}
	if v, ok := attr(passes[0], idemotel.KeyPurgeDeleted); !ok || v.AsInt64() != 0 {
		t.Errorf("deleted = %v", v.String())
	}
	if got := e.sum(t, "idem.purge.passes", idemotel.KeyPurgeResult.String("ok")); got != 1 {
		t.Errorf("purge passes = %d", got)
	}
}
