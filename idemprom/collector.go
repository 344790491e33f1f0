package idemprom

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/internal/tracers"
)

// Default bucket boundaries, in seconds or bytes.
var (
	// DefaultExecutionBuckets spans a fast handler (1 ms) to one that
	// nears a lease (90 s).
	DefaultExecutionBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 90}
	// DefaultStoreBuckets spans an in-memory call (100 µs) to a store
	// that stalls (5 s).
	DefaultStoreBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	// DefaultReplayAgeBuckets spans a retry after a second to one a week
	// later.
	DefaultReplayAgeBuckets = []float64{1, 5, 30, 60, 300, 900, 3600, 6 * 3600, 24 * 3600, 7 * 24 * 3600}
	// DefaultResponseBytesBuckets spans an empty answer to the default
	// MaxResponseBody of idemhttp (1 MiB).
	DefaultResponseBytesBuckets = []float64{0, 64, 256, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}
)

// DefaultMaxRoutes is Config.MaxRoutes's default.
const DefaultMaxRoutes = 500

// OtherRoute is the route label of requests past Config.MaxRoutes.
const OtherRoute = "other"

// Config configures a Collector. The zero value of every field means its
// documented default.
type Config struct {
	// Registerer registers the collector's metrics. Defaults to
	// prometheus.DefaultRegisterer.
	Registerer prometheus.Registerer

	// ExecutionBuckets, StoreBuckets, ReplayAgeBuckets and
	// ResponseBytesBuckets are the histograms' bucket boundaries.
	// Default to the Default… variables.
	ExecutionBuckets     []float64
	StoreBuckets         []float64
	ReplayAgeBuckets     []float64
	ResponseBytesBuckets []float64

	// MaxRoutes bounds the (method, route) pairs given series of their
	// own; the requests of any further pair are counted under the route
	// "other". It guards against a RouteFunc that returns raw paths.
	// Defaults to DefaultMaxRoutes.
	MaxRoutes int
}

// Collector is a tracer (idem.Tracer, with every optional interface, and
// idemclient.ClientTracer) that counts what it observes in Prometheus
// metrics. Set it in idem.Config.Tracer, idemjanitor.Config.Tracer and
// idemclient.Transport.Tracer; one Collector serves any number of
// engines, janitors and transports. It is safe for concurrent use.
//
// The metrics (docs/OBSERVABILITY.md says what each means):
//
//	idem_requests_total{outcome,method,route}
//	idem_execution_duration_seconds{outcome,route}
//	idem_operations_total{store,outcome}
//	idem_store_operation_duration_seconds{store,operation,result}
//	idem_in_flight
//	idem_lease_lost_total, idem_lease_takeovers_total, idem_heartbeat_failures_total
//	idem_purged_records_total, idem_purge_passes_total{result}, idem_purge_batches_total,
//	idem_purge_last_success_timestamp_seconds
//	idem_replay_age_seconds, idem_stored_response_bytes
//	idem_inbox_messages_total{consumer,action}
//	idem_client_attempts_total{outcome}, idem_client_retries_total{reason}
//
// No metric carries a tenant or a key.
type Collector struct {
	requests     *prometheus.CounterVec
	execution    *prometheus.HistogramVec
	operations   *prometheus.CounterVec
	storeOps     *prometheus.HistogramVec
	inFlight     prometheus.Gauge
	leaseLost    prometheus.Counter
	takeovers    prometheus.Counter
	heartbeats   prometheus.Counter
	purged       prometheus.Counter
	purgePasses  *prometheus.CounterVec
	purgeBatches prometheus.Counter
	purgeLast    prometheus.Gauge
	replayAge    prometheus.Histogram
	storedBytes  prometheus.Histogram
	inbox        *prometheus.CounterVec
	attempts     *prometheus.CounterVec
	retries      *prometheus.CounterVec

	all []prometheus.Collector

	// Label children made ahead, so that an observation is an index and
	// an atomic add: no label hashing, no allocation.
	attemptChildren []prometheus.Counter // by idemclient.AttemptOutcome
	retryChildren   []prometheus.Counter // by idemclient.AttemptOutcome
	purgeOK         prometheus.Counter
	purgeFailed     prometheus.Counter
	stores          cowMap[string, *storeChildren]
	lastStore       atomic.Pointer[namedStore[*storeChildren]]
	routes          cowMap[routeKey, *routeChildren]
	consumers       cowMap[string, *consumerChildren]
	maxRoutes       int
	routeCount      atomic.Int64
}

var attemptOutcomes = idemclient.AttemptOutcomes()

// The sizes of the children arrays: every value of each enumeration, the
// unknown zero included.
var (
	numOperationOutcomes = len(idem.OperationOutcomes()) + 1
	numStoreOperations   = len(idem.StoreOperations()) + 1
	numStoreResults      = len(tracers.StoreResultNames)
	numRequestKinds      = len(idemfront.Kinds()) + 1
)

// numInboxActions bounds the values of ideminbox.Action: one series per
// action is made up front, indexed by the action's value.
var numInboxActions = len(ideminbox.Actions()) + 1

// NewCollector makes the metrics and registers them with
// config.Registerer. It returns the registry's error when a metric of the
// same name is registered already (one Collector per registry). A nil
// config means every default.
func NewCollector(config *Config) (*Collector, error) {
	var cfg Config
	if config != nil {
		cfg = *config
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.DefaultRegisterer
	}
	if cfg.MaxRoutes <= 0 {
		cfg.MaxRoutes = DefaultMaxRoutes
	}
	buckets := func(b, def []float64) []float64 {
		if len(b) == 0 {
			return def
		}
		return b
	}
	c := &Collector{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_requests_total",
			Help: "Requests of the covered methods answered by a front end (idemhttp, idemgrpc, idemconnect), by outcome, method (the HTTP method, or grpc or connect) and route pattern (or full RPC method).",
		}, []string{"outcome", "method", "route"}),
		execution: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_execution_duration_seconds",
			Help:    "Time from the handler's start to the commit of its answer (handler plus completion), for the requests whose handler ran under the engine.",
			Buckets: buckets(cfg.ExecutionBuckets, DefaultExecutionBuckets),
		}, []string{"outcome", "route"}),
		operations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_operations_total",
			Help: "Engine operations (Engine.Do: requests, messages, direct calls), by store and outcome.",
		}, []string{"store", "outcome"}),
		storeOps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "idem_store_operation_duration_seconds",
			Help:    "Duration of the store calls of the engine, the heartbeat, the janitor and the inbox, by store, operation and result.",
			Buckets: buckets(cfg.StoreBuckets, DefaultStoreBuckets),
		}, []string{"store", "operation", "result"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_in_flight",
			Help: "Engine operations running now in this process (inside Engine.Do).",
		}),
		leaseLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_lease_lost_total",
			Help: "Executions whose lease was taken over while they ran; their work was discarded.",
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_lease_takeovers_total",
			Help: "Claims that took a key over from an earlier execution whose lease had ended (it died, stalled, or was released after recording steps).",
		}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_heartbeat_failures_total",
			Help: "Lease extensions that failed for another reason than a lost lease (retried at the next tick).",
		}),
		purged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_purged_records_total",
			Help: "Expired records deleted by the janitor.",
		}),
		purgePasses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_purge_passes_total",
			Help: "Purge passes of the janitor, by result (ok, error).",
		}, []string{"result"}),
		purgeBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "idem_purge_batches_total",
			Help: "Store.Purge calls of the janitor's passes; many per pass means it is deleting a backlog.",
		}),
		purgeLast: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "idem_purge_last_success_timestamp_seconds",
			Help: "Unix time of the end of the janitor's last pass that succeeded.",
		}),
		replayAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idem_replay_age_seconds",
			Help:    "Age of the replayed answers: time from their completion (store clock) to the replay (this process's clock).",
			Buckets: buckets(cfg.ReplayAgeBuckets, DefaultReplayAgeBuckets),
		}),
		storedBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "idem_stored_response_bytes",
			Help:    "Size of the bodies stored by completed executions.",
			Buckets: buckets(cfg.ResponseBytesBuckets, DefaultResponseBytesBuckets),
		}),
		inbox: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_inbox_messages_total",
			Help: "Messages processed by ideminbox, by consumer and action told to the broker.",
		}, []string{"consumer", "action"}),
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_client_attempts_total",
			Help: "Attempts sent by idemclient, by outcome.",
		}, []string{"outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "idem_client_retries_total",
			Help: "Retries decided by idemclient, by reason (the outcome of the attempt retried).",
		}, []string{"reason"}),
		maxRoutes:       cfg.MaxRoutes,
		attemptChildren: make([]prometheus.Counter, len(attemptOutcomes)+1),
		retryChildren:   make([]prometheus.Counter, len(attemptOutcomes)+1),
	}
	c.all = []prometheus.Collector{
		c.requests, c.execution, c.operations, c.storeOps, c.inFlight, c.leaseLost, c.takeovers,
		c.heartbeats, c.purged, c.purgePasses, c.purgeBatches, c.purgeLast, c.replayAge, c.storedBytes,
		c.inbox, c.attempts, c.retries,
	}
	for _, o := range attemptOutcomes {
		c.attemptChildren[o] = c.attempts.WithLabelValues(o.String())
		switch o {
		case idemclient.AttemptResponse, idemclient.AttemptReplayed, idemclient.AttemptCancelled:
			// Never a reason to retry.
		default:
			c.retryChildren[o] = c.retries.WithLabelValues(o.String())
		}
	}
	c.purgeOK = c.purgePasses.WithLabelValues("ok")
	c.purgeFailed = c.purgePasses.WithLabelValues("error")
	if err := cfg.Registerer.Register(c); err != nil {
		return nil, err
	}
	return c, nil
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.all {
		m.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.all {
		m.Collect(ch)
	}
}

// storeChildren are the series of one store.
type storeChildren struct {
	operations []prometheus.Counter    // by idem.OperationOutcome
	calls      [][]prometheus.Observer // by idem.StoreOperation, then tracers.StoreResult
}

func (c *Collector) store(name string) *storeChildren {
	// One store per engine, most often one in all: the last one saves
	// the map's hashing.
	if last := c.lastStore.Load(); last != nil && last.name == name {
		return last.children
	}
	children := c.storeOf(name)
	c.lastStore.Store(&namedStore[*storeChildren]{name, children})
	return children
}

// namedStore is the last store looked up.
type namedStore[V any] struct {
	name     string
	children V
}

func (c *Collector) storeOf(name string) *storeChildren {
	return c.stores.get(name, func() *storeChildren {
		s := &storeChildren{
			operations: make([]prometheus.Counter, numOperationOutcomes),
			calls:      make([][]prometheus.Observer, numStoreOperations),
		}
		for _, o := range idem.OperationOutcomes() {
			s.operations[o] = c.operations.WithLabelValues(name, o.String())
		}
		for _, op := range idem.StoreOperations() {
			s.calls[op] = make([]prometheus.Observer, numStoreResults)
			for r := 1; r < numStoreResults; r++ {
				s.calls[op][r] = c.storeOps.WithLabelValues(name, op.String(), tracers.StoreResultNames[r])
			}
		}
		return s
	})
}

type routeKey struct{ method, route string }

// routeChildren are the series of one (method, route). The execution
// histograms are made at their first observation: most outcomes never
// run a handler, and a histogram is a dozen series.
type routeChildren struct {
	requests  []prometheus.Counter // by idemfront.Kind
	route     string
	mu        sync.Mutex
	execution []atomic.Pointer[observer] // by idemfront.Kind
}

type observer struct{ prometheus.Observer }

func (c *Collector) route(method, route string) *routeChildren {
	k := routeKey{method, route}
	if r, ok := c.routes.lookup(k); ok {
		return r
	}
	if c.routeCount.Load() >= int64(c.maxRoutes) {
		k = routeKey{method, OtherRoute}
	}
	return c.routes.get(k, func() *routeChildren {
		c.routeCount.Add(1)
		r := &routeChildren{
			requests:  make([]prometheus.Counter, numRequestKinds),
			route:     k.route,
			execution: make([]atomic.Pointer[observer], numRequestKinds),
		}
		for _, o := range idemfront.Kinds() {
			r.requests[o] = c.requests.WithLabelValues(o.Label(), k.method, k.route)
		}
		return r
	})
}

func (c *Collector) executionOf(r *routeChildren, o idemfront.Kind) prometheus.Observer {
	if h := r.execution[o].Load(); h != nil {
		return h.Observer
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if h := r.execution[o].Load(); h != nil {
		return h.Observer
	}
	h := &observer{c.execution.WithLabelValues(o.Label(), r.route)}
	r.execution[o].Store(h)
	return h.Observer
}

// consumerChildren are the series of one inbox consumer.
type consumerChildren struct {
	actions []prometheus.Counter // by ideminbox.Action
	other   *prometheus.CounterVec
	name    string
}

func (c *Collector) consumer(name string) *consumerChildren {
	return c.consumers.get(name, func() *consumerChildren {
		s := &consumerChildren{actions: make([]prometheus.Counter, numInboxActions), other: c.inbox, name: name}
		for _, a := range ideminbox.Actions() {
			s.actions[a] = c.inbox.WithLabelValues(name, a.String())
		}
		return s
	})
}

func (s *consumerChildren) action(a ideminbox.Action) prometheus.Counter {
	if int(a) < len(s.actions) && s.actions[a] != nil {
		return s.actions[a]
	}
	return s.other.WithLabelValues(s.name, a.String())
}

// TraceOperationStart implements idem.Tracer.
func (c *Collector) TraceOperationStart(ctx context.Context, _ idem.TraceOperationStartData) context.Context {
	c.inFlight.Inc()
	return ctx
}

// TraceOperationEnd implements idem.Tracer.
func (c *Collector) TraceOperationEnd(_ context.Context, d idem.TraceOperationEndData) {
	c.inFlight.Dec()
	if int(d.Outcome) < numOperationOutcomes {
		if m := c.store(d.Store).operations[d.Outcome]; m != nil {
			m.Inc()
		}
	}
	switch d.Outcome {
	case idem.OutcomeReplayed:
		c.replayAge.Observe(d.ReplayAge.Seconds())
	case idem.OutcomeExecuted:
		c.storedBytes.Observe(float64(d.ResponseBytes))
	}
}

// TraceStoreStart implements idem.StoreTracer.
func (c *Collector) TraceStoreStart(ctx context.Context, _ idem.TraceStoreStartData) context.Context {
	return ctx
}

// TraceStoreEnd implements idem.StoreTracer.
func (c *Collector) TraceStoreEnd(_ context.Context, d idem.TraceStoreEndData) {
	if int(d.Operation) >= numStoreOperations {
		return
	}
	if m := c.store(d.Store).calls[d.Operation]; m != nil {
		m[tracers.StoreResult(d.Err)].Observe(d.Duration.Seconds())
	}
}

// TraceLease implements idem.LeaseTracer.
func (c *Collector) TraceLease(_ context.Context, d idem.TraceLeaseData) {
	switch d.Event {
	case idem.LeaseLost:
		c.leaseLost.Inc()
	case idem.LeaseTakeover:
		c.takeovers.Inc()
	case idem.LeaseHeartbeatFailed:
		c.heartbeats.Inc()
	}
}

// TracePurge implements idemjanitor.PurgeTracer.
func (c *Collector) TracePurge(_ context.Context, d idemjanitor.TracePurgeData) {
	c.purged.Add(float64(d.Deleted))
	c.purgeBatches.Add(float64(d.Batches))
	if d.Err != nil && !errors.Is(d.Err, context.Canceled) {
		c.purgeFailed.Inc()
		return
	}
	if d.Err == nil {
		c.purgeOK.Inc()
		c.purgeLast.Set(float64(time.Now().UnixNano()) / 1e9)
	}
}

// TraceRequestStart implements idemfront.RequestTracer.
func (c *Collector) TraceRequestStart(ctx context.Context, _ idemfront.TraceRequestStartData) context.Context {
	return ctx
}

// TraceRequestEnd implements idemfront.RequestTracer.
func (c *Collector) TraceRequestEnd(_ context.Context, d idemfront.TraceRequestEndData) {
	if int(d.Kind) >= numRequestKinds {
		return
	}
	r := c.route(d.MetricMethod(), d.Route)
	if m := r.requests[d.Kind]; m != nil {
		m.Inc()
	}
	if d.Execution > 0 {
		c.executionOf(r, d.Kind).Observe(d.Execution.Seconds())
	}
}

// TraceMessageStart implements ideminbox.MessageTracer.
func (c *Collector) TraceMessageStart(ctx context.Context, _ ideminbox.TraceMessageStartData) context.Context {
	return ctx
}

// TraceMessageEnd implements ideminbox.MessageTracer.
func (c *Collector) TraceMessageEnd(_ context.Context, d ideminbox.TraceMessageEndData) {
	c.consumer(d.Consumer).action(d.Action).Inc()
}

// TraceAttemptStart implements idemclient.ClientTracer.
func (c *Collector) TraceAttemptStart(ctx context.Context, _ idemclient.TraceAttemptStartData) context.Context {
	return ctx
}

// TraceAttemptEnd implements idemclient.ClientTracer.
func (c *Collector) TraceAttemptEnd(_ context.Context, d idemclient.TraceAttemptEndData) {
	if int(d.Outcome) < len(c.attemptChildren) && c.attemptChildren[d.Outcome] != nil {
		c.attemptChildren[d.Outcome].Inc()
	}
}

// TraceRetry implements idemclient.ClientTracer.
func (c *Collector) TraceRetry(_ context.Context, d idemclient.TraceRetryData) {
	if int(d.Reason) < len(c.retryChildren) && c.retryChildren[d.Reason] != nil {
		c.retryChildren[d.Reason].Inc()
	}
}

// The interfaces a Collector implements.
var (
	_ idem.Tracer             = (*Collector)(nil)
	_ idem.StoreTracer        = (*Collector)(nil)
	_ idem.LeaseTracer        = (*Collector)(nil)
	_ idemjanitor.PurgeTracer = (*Collector)(nil)
	_ idemfront.RequestTracer = (*Collector)(nil)
	_ ideminbox.MessageTracer = (*Collector)(nil)
	_ idemclient.ClientTracer = (*Collector)(nil)
	_ prometheus.Collector    = (*Collector)(nil)
)

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

func (c *cowMap[K, V]) get(k K, newValue func() V) V {
	if v, ok := c.lookup(k); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil {
		if v, ok := (*old)[k]; ok {
			return v
		}
	}
	n := make(map[K]V, 1)
	if old != nil {
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
