package idemotel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/internal/fieldtext"
	"github.com/idem-go/idem/internal/tracers"
)

// ScopeName is the instrumentation scope of the spans and metrics.
const ScopeName = "github.com/idem-go/idem/idemotel"

// The attribute keys of the spans and metrics (docs/OBSERVABILITY.md says
// what each means).
const (
	KeyOutcome          = attribute.Key("idem.outcome")
	KeyOperationOutcome = attribute.Key("idem.operation.outcome")
	KeyReplayed         = attribute.Key("idem.replayed")
	KeyStore            = attribute.Key("idem.store")
	KeyKeyHash          = attribute.Key("idem.key_hash")
	KeyTenant           = attribute.Key("idem.tenant")
	KeyTakeover         = attribute.Key("idem.takeover")
	KeyReplayAge        = attribute.Key("idem.replay_age")
	KeyResponseSize     = attribute.Key("idem.stored_response.size")
	KeyStoreOperation   = attribute.Key("idem.store.operation")
	KeyStoreResult      = attribute.Key("idem.store.result")
	KeyConsumer         = attribute.Key("idem.consumer")
	KeyInboxAction      = attribute.Key("idem.inbox.action")
	KeyPurgeDeleted     = attribute.Key("idem.purge.deleted")
	KeyPurgeBatches     = attribute.Key("idem.purge.batches")
	KeyPurgeResult      = attribute.Key("idem.purge.result")
	KeyClientOutcome    = attribute.Key("idem.client.outcome")
	KeyRetryReason      = attribute.Key("idem.client.retry.reason")
	KeyMethod           = attribute.Key("http.request.method")
	KeyRoute            = attribute.Key("http.route")
	// KeyRPCSystem is set on the request spans of an RPC front end:
	// "grpc" (idemgrpc) or "connect_rpc" (idemconnect), as OpenTelemetry's
	// RPC conventions name them.
	KeyRPCSystem   = attribute.Key("rpc.system")
	KeyStatus      = attribute.Key("http.response.status_code")
	KeyResendCount = attribute.Key("http.request.resend_count")
	KeyDestination = attribute.Key("messaging.destination.name")
)

// Config configures a Tracer. The zero value of every field means its
// documented default.
type Config struct {
	// TracerProvider makes the spans. Defaults to the global one
	// (otel.GetTracerProvider()).
	TracerProvider trace.TracerProvider
	// MeterProvider makes the metrics. Defaults to the global one
	// (otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// RecordTenant adds the tenant (idem.tenant) to the spans. Defaults
	// to false: a tenant names a customer, which a trace backend may not
	// be meant to hold. Keys are never recorded, only a short hash of
	// tenant and key (idem.key_hash) that tells the spans of one key
	// apart from the others'.
	RecordTenant bool
	// NoStoreSpans leaves out the child span of each store call (claim,
	// begin, complete, …); the store metrics stay. Defaults to false.
	NoStoreSpans bool
}

// Tracer is an idem tracer (idem.Tracer with every optional interface,
// and idemclient.ClientTracer) that reports to OpenTelemetry: a span per
// request, message or operation, a child span per store call, span events
// for lease events, and metrics named like idemprom's, dotted
// (idem.requests, idem.store.operation.duration, …). Set it in
// idem.Config.Tracer, idemjanitor.Config.Tracer and
// idemclient.Transport.Tracer. It is safe for concurrent use.
type Tracer struct {
	tracer       trace.Tracer
	recordTenant bool
	storeSpans   bool

	requests     metric.Int64Counter
	execution    metric.Float64Histogram
	operations   metric.Int64Counter
	storeOps     metric.Float64Histogram
	inFlight     metric.Int64UpDownCounter
	leaseLost    metric.Int64Counter
	takeovers    metric.Int64Counter
	heartbeats   metric.Int64Counter
	purged       metric.Int64Counter
	purgePasses  metric.Int64Counter
	purgeBatches metric.Int64Counter
	replayAge    metric.Float64Histogram
	storedBytes  metric.Float64Histogram
	inbox        metric.Int64Counter
	attempts     metric.Int64Counter
	retries      metric.Int64Counter

	// Attribute sets made ahead, by enumeration value.
	attemptSets []metric.MeasurementOption
	retrySets   []metric.MeasurementOption
	purgeOK     metric.MeasurementOption
	purgeFailed metric.MeasurementOption
	stores      cowMap[string, *storeSets]
	lastStore   atomic.Pointer[namedStore[*storeSets]]
	routes      cowMap[routeKey, *routeSets]
	consumers   cowMap[string, *consumerSets]
}

// New returns a Tracer on config's providers. A nil config means every
// default.
func New(config *Config) (*Tracer, error) {
	var cfg Config
	if config != nil {
		cfg = *config
	}
	if cfg.TracerProvider == nil {
		cfg.TracerProvider = otel.GetTracerProvider()
	}
	if cfg.MeterProvider == nil {
		cfg.MeterProvider = otel.GetMeterProvider()
	}
	m := cfg.MeterProvider.Meter(ScopeName)
	t := &Tracer{
		tracer:       cfg.TracerProvider.Tracer(ScopeName),
		recordTenant: cfg.RecordTenant,
		storeSpans:   !cfg.NoStoreSpans,
	}
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, unit, desc string, bounds ...float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit(unit), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	t.requests = counter("idem.requests", "{request}", "Requests of the covered methods answered by idemhttp, by outcome, method and route.")
	t.execution = histogram("idem.execution.duration", "s", "Time from the handler's start to the commit of its answer, for requests whose handler ran under the engine.",
		.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 90)
	t.operations = counter("idem.operations", "{operation}", "Engine operations, by store and outcome.")
	t.storeOps = histogram("idem.store.operation.duration", "s", "Duration of the store calls, by store, operation and result.",
		.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5)
	var err error
	t.inFlight, err = m.Int64UpDownCounter("idem.in_flight", metric.WithUnit("{operation}"), metric.WithDescription("Engine operations running now in this process."))
	errs = append(errs, err)
	t.leaseLost = counter("idem.lease.lost", "{execution}", "Executions whose lease was taken over while they ran.")
	t.takeovers = counter("idem.lease.takeovers", "{claim}", "Claims that took a key over from an execution whose lease had ended.")
	t.heartbeats = counter("idem.heartbeat.failures", "{extension}", "Lease extensions that failed for another reason than a lost lease.")
	t.purged = counter("idem.purged.records", "{record}", "Expired records deleted by the janitor.")
	t.purgePasses = counter("idem.purge.passes", "{pass}", "Purge passes of the janitor, by result.")
	t.purgeBatches = counter("idem.purge.batches", "{batch}", "Store.Purge calls of the janitor's passes.")
	t.replayAge = histogram("idem.replay.age", "s", "Age of the replayed answers, from their completion to the replay.",
		1, 5, 30, 60, 300, 900, 3600, 6*3600, 24*3600, 7*24*3600)
	t.storedBytes = histogram("idem.stored_response.size", "By", "Size of the bodies stored by completed executions.",
		0, 64, 256, 1<<10, 4<<10, 16<<10, 64<<10, 256<<10, 1<<20)
	t.inbox = counter("idem.inbox.messages", "{message}", "Messages processed by ideminbox, by consumer and action.")
	t.attempts = counter("idem.client.attempts", "{attempt}", "Attempts sent by idemclient, by outcome.")
	t.retries = counter("idem.client.retries", "{retry}", "Retries decided by idemclient, by reason.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	outcomes := idemclient.AttemptOutcomes()
	t.attemptSets = make([]metric.MeasurementOption, len(outcomes)+1)
	t.retrySets = make([]metric.MeasurementOption, len(outcomes)+1)
	for _, o := range outcomes {
		t.attemptSets[o] = metric.WithAttributeSet(attribute.NewSet(KeyClientOutcome.String(o.String())))
		t.retrySets[o] = metric.WithAttributeSet(attribute.NewSet(KeyRetryReason.String(o.String())))
	}
	t.purgeOK = metric.WithAttributeSet(attribute.NewSet(KeyPurgeResult.String("ok")))
	t.purgeFailed = metric.WithAttributeSet(attribute.NewSet(KeyPurgeResult.String("error")))
	return t, nil
}

// The interfaces a Tracer implements.
var (
	_ idem.Tracer             = (*Tracer)(nil)
	_ idem.StoreTracer        = (*Tracer)(nil)
	_ idem.LeaseTracer        = (*Tracer)(nil)
	_ idemjanitor.PurgeTracer = (*Tracer)(nil)
	_ idemfront.RequestTracer = (*Tracer)(nil)
	_ ideminbox.MessageTracer = (*Tracer)(nil)
	_ idemclient.ClientTracer = (*Tracer)(nil)
)

// frontKey marks a context whose span a front end (a request, a
// message) started: the engine's first operation under it reports on that
// span rather than starting one of its own.
type frontKey struct{}

// frontCtx is the context of a front end's span.
type frontCtx struct {
	context.Context
	span    trace.Span
	claimed atomic.Bool // an operation reports on span
}

func (c *frontCtx) Value(key any) any {
	if _, ok := key.(frontKey); ok {
		return c
	}
	return c.Context.Value(key)
}

// front returns the front end's span that the operation running in ctx
// reports on, or nil when the operation has a span of its own.
func front(ctx context.Context) trace.Span {
	f, _ := ctx.Value(frontKey{}).(*frontCtx)
	if f == nil {
		return nil
	}
	// Spans are not all comparable: their identities are.
	if sc, fc := trace.SpanContextFromContext(ctx), f.span.SpanContext(); sc.SpanID() != fc.SpanID() || sc.TraceID() != fc.TraceID() {
		return nil
	}
	return f.span
}

// KeyHash returns the idem.key_hash of (tenant, key): the first 8 bytes of
// the SHA-256 of tenant, a zero byte and key, in hex. It tells the spans
// of one key apart without recording the key, and can be computed from a
// key a user reports.
func KeyHash(tenant, key string) string {
	h := sha256.New()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:8])
}

// failed reports whether an operation's outcome is a failure of the
// server (an error status on its span), not an answer to the caller.
func failed(o idem.OperationOutcome) bool {
	switch o {
	case idem.OutcomeLeaseLost, idem.OutcomeStoreUnavailable, idem.OutcomeHandlerError, idem.OutcomeHandlerPanic,
		idem.OutcomeStepNotSaved:
		return true
	}
	return false
}

// TraceOperationStart implements idem.Tracer: a span "idem.operation",
// unless a request or message span is already there, which the
// operation's attributes then go to.
func (t *Tracer) TraceOperationStart(ctx context.Context, d idem.TraceOperationStartData) context.Context {
	t.inFlight.Add(ctx, 1)
	span := front(ctx)
	if f, _ := ctx.Value(frontKey{}).(*frontCtx); span == nil || !f.claimed.CompareAndSwap(false, true) {
		// No front end's span, or another operation (a nested one, an
		// inbox's second) reports on it already.
		ctx, span = t.tracer.Start(ctx, "idem.operation")
	}
	if span.IsRecording() {
		attrs := []attribute.KeyValue{KeyStore.String(d.Store), KeyKeyHash.String(KeyHash(d.Tenant, d.Key))}
		if t.recordTenant {
			attrs = append(attrs, KeyTenant.String(fieldtext.Escape(d.Tenant)))
		}
		span.SetAttributes(attrs...)
	}
	return ctx
}

// TraceOperationEnd implements idem.Tracer.
func (t *Tracer) TraceOperationEnd(ctx context.Context, d idem.TraceOperationEndData) {
	t.inFlight.Add(ctx, -1)
	if s := t.store(d.Store); int(d.Outcome) < len(s.operations) {
		t.operations.Add(ctx, 1, s.operations[d.Outcome])
	}
	switch d.Outcome {
	case idem.OutcomeReplayed:
		t.replayAge.Record(ctx, d.ReplayAge.Seconds())
	case idem.OutcomeExecuted:
		t.storedBytes.Record(ctx, float64(d.ResponseBytes))
	}
	span := trace.SpanFromContext(ctx)
	front := front(ctx) != nil
	if span.IsRecording() {
		attrs := make([]attribute.KeyValue, 0, 6)
		attrs = append(attrs, KeyOperationOutcome.String(d.Outcome.String()), KeyReplayed.Bool(d.Outcome == idem.OutcomeReplayed))
		if !front {
			attrs = append(attrs, KeyOutcome.String(d.Outcome.String()))
		}
		if d.Takeover {
			attrs = append(attrs, KeyTakeover.Bool(true))
		}
		switch d.Outcome {
		case idem.OutcomeReplayed:
			attrs = append(attrs, KeyReplayAge.Float64(d.ReplayAge.Seconds()), KeyResponseSize.Int(d.ResponseBytes))
		case idem.OutcomeExecuted:
			attrs = append(attrs, KeyResponseSize.Int(d.ResponseBytes))
		}
		span.SetAttributes(attrs...)
		if failed(d.Outcome) && !front {
			if d.Err != nil {
				recordError(span, d.Err)
			}
			span.SetStatus(codes.Error, d.Outcome.String())
		}
	}
	if !front {
		span.End()
	}
}

// TraceStoreStart implements idem.StoreTracer: a child span
// "idem.store.<operation>".
func (t *Tracer) TraceStoreStart(ctx context.Context, d idem.TraceStoreStartData) context.Context {
	if !t.storeSpans || !trace.SpanFromContext(ctx).IsRecording() {
		// No span of idem's under way (an unsampled request, or the
		// heartbeat of one): a store span would be a root of its own.
		return ctx
	}
	ctx, _ = t.tracer.Start(ctx, storeSpanNames[d.Operation], trace.WithAttributes(KeyStore.String(d.Store)))
	return ctx
}

var storeSpanNames = func() []string {
	ops := idem.StoreOperations()
	names := make([]string, len(ops)+1)
	names[0] = "idem.store"
	for _, op := range ops {
		names[op] = "idem.store." + op.String()
	}
	return names
}()

// TraceStoreEnd implements idem.StoreTracer.
func (t *Tracer) TraceStoreEnd(ctx context.Context, d idem.TraceStoreEndData) {
	s := t.store(d.Store)
	result := tracers.StoreResult(d.Err)
	if int(d.Operation) < len(s.calls) {
		t.storeOps.Record(ctx, d.Duration.Seconds(), s.calls[d.Operation][result])
	}
	if !t.storeSpans {
		return
	}
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(KeyStoreResult.String(tracers.StoreResultNames[result]))
	if result == tracers.StoreFailed {
		if d.Err != nil {
			recordError(span, d.Err)
		}
		span.SetStatus(codes.Error, "store call failed")
	}
	span.End()
}

// TraceLease implements idem.LeaseTracer: a counter, and an event on the
// operation's span.
func (t *Tracer) TraceLease(ctx context.Context, d idem.TraceLeaseData) {
	switch d.Event {
	case idem.LeaseLost:
		t.leaseLost.Add(ctx, 1)
	case idem.LeaseTakeover:
		t.takeovers.Add(ctx, 1)
	case idem.LeaseHeartbeatFailed:
		t.heartbeats.Add(ctx, 1)
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		opts := []trace.EventOption{trace.WithAttributes(KeyStore.String(d.Store))}
		if d.Err != nil {
			opts = append(opts, trace.WithAttributes(attribute.String("exception.message", errorText(d.Err))))
		}
		span.AddEvent("idem.lease."+d.Event.String(), opts...)
	}
}

// TracePurge implements idemjanitor.PurgeTracer: a span "idem.purge" covering
// the pass, and the purge counters.
func (t *Tracer) TracePurge(ctx context.Context, d idemjanitor.TracePurgeData) {
	t.purged.Add(ctx, int64(d.Deleted))
	t.purgeBatches.Add(ctx, int64(d.Batches))
	cancelled := errors.Is(d.Err, context.Canceled)
	switch {
	case d.Err == nil:
		t.purgePasses.Add(ctx, 1, t.purgeOK)
	case !cancelled:
		t.purgePasses.Add(ctx, 1, t.purgeFailed)
	}
	end := time.Now()
	_, span := t.tracer.Start(ctx, "idem.purge", trace.WithTimestamp(end.Add(-d.Duration)), trace.WithAttributes(
		KeyStore.String(d.Store), KeyPurgeDeleted.Int(d.Deleted), KeyPurgeBatches.Int(d.Batches)))
	if d.Err != nil && !cancelled {
		recordError(span, d.Err)
		span.SetStatus(codes.Error, "purge failed")
	}
	span.End(trace.WithTimestamp(end))
}

// TraceRequestStart implements idemfront.RequestTracer: a span "idem.request",
// which the engine's operation reports on and the handler's spans are
// children of.
func (t *Tracer) TraceRequestStart(ctx context.Context, d idemfront.TraceRequestStartData) context.Context {
	// Attributes set once the span records: given to Start, they would be
	// allocated for the spans the sampler drops too.
	ctx, span := t.tracer.Start(ctx, "idem.request")
	if span.IsRecording() {
		span.SetAttributes(KeyMethod.String(d.MetricMethod()), KeyRoute.String(d.Route))
		if d.Protocol != "" {
			span.SetAttributes(KeyRPCSystem.String(rpcSystem(d.Protocol)))
		}
	}
	return &frontCtx{Context: ctx, span: span}
}

// TraceRequestEnd implements idemfront.RequestTracer.
func (t *Tracer) TraceRequestEnd(ctx context.Context, d idemfront.TraceRequestEndData) {
	if r := t.route(d.MetricMethod(), d.Route); int(d.Kind) < len(r.requests) {
		t.requests.Add(ctx, 1, r.requests[d.Kind])
		if d.Execution > 0 {
			t.execution.Record(ctx, d.Execution.Seconds(), r.execution[d.Kind])
		}
	}
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		attrs := []attribute.KeyValue{KeyOutcome.String(d.Kind.Label()), KeyRoute.String(d.Route)}
		if d.Status != 0 {
			attrs = append(attrs, KeyStatus.Int(d.Status))
		}
		if d.Kind != idemfront.Replayed {
			attrs = append(attrs, KeyReplayed.Bool(false))
		}
		span.SetAttributes(attrs...)
		if d.Kind.Failed() {
			if d.Err != nil {
				recordError(span, d.Err)
			}
			span.SetStatus(codes.Error, d.Kind.Label())
		}
	}
	span.End()
}

// TraceMessageStart implements ideminbox.MessageTracer: a consumer span
// "idem.message", which the engine's operation reports on and the
// handler's spans are children of.
func (t *Tracer) TraceMessageStart(ctx context.Context, d ideminbox.TraceMessageStartData) context.Context {
	ctx, span := t.tracer.Start(ctx, "idem.message", trace.WithSpanKind(trace.SpanKindConsumer))
	if span.IsRecording() {
		span.SetAttributes(KeyConsumer.String(fieldtext.Escape(d.Consumer)), KeyDestination.String(fieldtext.Escape(d.Subject)))
	}
	return &frontCtx{Context: ctx, span: span}
}

// TraceMessageEnd implements ideminbox.MessageTracer.
func (t *Tracer) TraceMessageEnd(ctx context.Context, d ideminbox.TraceMessageEndData) {
	t.inbox.Add(ctx, 1, t.consumer(d.Consumer).action(d.Action))
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		span.SetAttributes(KeyInboxAction.String(d.Action.String()), KeyOutcome.String(d.Action.String()))
		if d.Err != nil && d.Action != ideminbox.Ack && d.Action != ideminbox.AckDuplicate {
			recordError(span, d.Err)
		}
	}
	span.End()
}

// TraceAttemptStart implements idemclient.ClientTracer: a span
// "idem.attempt" per attempt, parent of the Base transport's client span.
func (t *Tracer) TraceAttemptStart(ctx context.Context, d idemclient.TraceAttemptStartData) context.Context {
	attrs := []attribute.KeyValue{KeyMethod.String(d.Method)}
	if d.Resend > 0 {
		attrs = append(attrs, KeyResendCount.Int(d.Resend))
	}
	ctx, _ = t.tracer.Start(ctx, "idem.attempt", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	return ctx
}

// TraceAttemptEnd implements idemclient.ClientTracer.
func (t *Tracer) TraceAttemptEnd(ctx context.Context, d idemclient.TraceAttemptEndData) {
	if int(d.Outcome) < len(t.attemptSets) && t.attemptSets[d.Outcome] != nil {
		t.attempts.Add(ctx, 1, t.attemptSets[d.Outcome])
	}
	span := trace.SpanFromContext(ctx)
	if span.IsRecording() {
		attrs := []attribute.KeyValue{KeyClientOutcome.String(d.Outcome.String()), KeyReplayed.Bool(d.Outcome == idemclient.AttemptReplayed)}
		if d.Status != 0 {
			attrs = append(attrs, KeyStatus.Int(d.Status))
		}
		span.SetAttributes(attrs...)
		if d.Err != nil {
			recordError(span, d.Err)
			span.SetStatus(codes.Error, d.Outcome.String())
		}
	}
	span.End()
}

// TraceRetry implements idemclient.ClientTracer: a counter, and an event
// on the span in ctx (the caller's).
func (t *Tracer) TraceRetry(ctx context.Context, d idemclient.TraceRetryData) {
	if int(d.Reason) < len(t.retrySets) && t.retrySets[d.Reason] != nil {
		t.retries.Add(ctx, 1, t.retrySets[d.Reason])
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent("idem.retry", trace.WithAttributes(KeyRetryReason.String(d.Reason.String()),
			attribute.Float64("idem.retry.wait", d.Wait.Seconds()), KeyResendCount.Int(d.Resend)))
	}
}

// storeSets are the attribute sets of one store.
type storeSets struct {
	operations []metric.MeasurementOption   // by idem.OperationOutcome
	calls      [][]metric.MeasurementOption // by idem.StoreOperation, then tracers.StoreResult
}

func (t *Tracer) store(name string) *storeSets {
	// One store per engine, most often one in all: the last one saves
	// the map's hashing.
	if last := t.lastStore.Load(); last != nil && last.name == name {
		return last.children
	}
	children := t.storeOf(name)
	t.lastStore.Store(&namedStore[*storeSets]{name, children})
	return children
}

// namedStore is the last store looked up.
type namedStore[V any] struct {
	name     string
	children V
}

func (t *Tracer) storeOf(name string) *storeSets {
	return t.stores.get(name, func() *storeSets {
		outcomes, ops := idem.OperationOutcomes(), idem.StoreOperations()
		s := &storeSets{operations: make([]metric.MeasurementOption, len(outcomes)+1), calls: make([][]metric.MeasurementOption, len(ops)+1)}
		s.operations[0] = metric.WithAttributeSet(attribute.NewSet(KeyStore.String(name), KeyOutcome.String("unknown")))
		for _, o := range outcomes {
			s.operations[o] = metric.WithAttributeSet(attribute.NewSet(KeyStore.String(name), KeyOutcome.String(o.String())))
		}
		for i := range s.calls {
			s.calls[i] = make([]metric.MeasurementOption, len(tracers.StoreResultNames))
			for j := range s.calls[i] {
				s.calls[i][j] = metric.WithAttributeSet(attribute.NewSet(KeyStore.String(name),
					KeyStoreOperation.String(idem.StoreOperation(i).String()), KeyStoreResult.String(tracers.StoreResultNames[j])))
			}
		}
		return s
	})
}

type routeKey struct{ method, route string }

// routeSets are the attribute sets of one (method, route).
type routeSets struct {
	requests  []metric.MeasurementOption // by idemfront.Kind
	execution []metric.MeasurementOption // by idemfront.Kind
}

// maxRoutes bounds the routes given attribute sets of their own; the
// others are reported as route "other".
const maxRoutes = 500

func (t *Tracer) route(method, route string) *routeSets {
	k := routeKey{method, route}
	if r, ok := t.routes.lookup(k); ok {
		return r
	}
	if t.routes.len() >= maxRoutes {
		k.route = "other"
	}
	return t.routes.get(k, func() *routeSets {
		n := len(idemfront.Kinds()) + 1
		r := &routeSets{requests: make([]metric.MeasurementOption, n), execution: make([]metric.MeasurementOption, n)}
		for i := range n {
			o := idemfront.Kind(i).Label()
			r.requests[i] = metric.WithAttributeSet(attribute.NewSet(KeyOutcome.String(o), KeyMethod.String(k.method), KeyRoute.String(k.route)))
			r.execution[i] = metric.WithAttributeSet(attribute.NewSet(KeyOutcome.String(o), KeyRoute.String(k.route)))
		}
		return r
	})
}

// consumerSets are the attribute sets of one inbox consumer.
type consumerSets struct {
	name    string
	actions []metric.MeasurementOption // by ideminbox.Action
}

func (t *Tracer) consumer(name string) *consumerSets {
	return t.consumers.get(name, func() *consumerSets {
		actions := ideminbox.Actions()
		c := &consumerSets{name: name, actions: make([]metric.MeasurementOption, len(actions)+1)}
		for _, a := range actions {
			c.actions[a] = metric.WithAttributeSet(attribute.NewSet(KeyConsumer.String(name), KeyInboxAction.String(a.String())))
		}
		return c
	})
}

func (c *consumerSets) action(a ideminbox.Action) metric.MeasurementOption {
	if int(a) < len(c.actions) && c.actions[a] != nil {
		return c.actions[a]
	}
	return metric.WithAttributes(KeyConsumer.String(c.name), KeyInboxAction.String(a.String()))
}

// cowMap is a map read without a lock: a copy is written, under mu, for
// each new key. Its keys (stores, routes, consumers) are few and settle
// early, while it is read on every observation.
type cowMap[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

func (c *cowMap[K, V]) lookup(k K) (V, bool) {
	if m := c.m.Load(); m != nil {
		v, ok := (*m)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

func (c *cowMap[K, V]) len() int {
	if m := c.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}

func (c *cowMap[K, V]) get(k K, newValue func() V) V {
	if v, ok := c.lookup(k); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	n := make(map[K]V, 1)
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
		n = make(map[K]V, len(*old)+1)
		for key, v := range *old {
			n[key] = v
		}
	}
	v := newValue()
	n[k] = v
	c.m.Store(&n)
	return v
}

// rpcSystem names a front end's protocol as OpenTelemetry's rpc.system
// does.
func rpcSystem(protocol string) string {
	if protocol == "connect" {
		return "connect_rpc"
	}
	return protocol
}
