package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemclient"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/ideminbox"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/internal/obsload"
)

var quiet = slog.New(slog.DiscardHandler)

// metrics reads every series of reg: counters and gauges by their name
// and labels ("idem_requests_total{method=POST,outcome=executed,route=/orders}"),
// histograms as name_count and name_sum.
func metrics(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			labels := make([]string, 0, len(m.GetLabel()))
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(labels)
			suffix := ""
			if len(labels) > 0 {
				suffix = "{" + strings.Join(labels, ",") + "}"
			}
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[f.GetName()+suffix] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[f.GetName()+suffix] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[f.GetName()+"_count"+suffix] = float64(m.GetHistogram().GetSampleCount())
				out[f.GetName()+"_sum"+suffix] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// want checks the series named in want, and that every other series of
// the same families that counts something is zero.
func want(t *testing.T, got map[string]float64, want map[string]float64) {
	t.Helper()
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}

func newCollector(t testing.TB) (*idemprom.Collector, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// server returns the workload's app behind the middleware over an
// engine traced by c, on a ServeMux route.
func server(t *testing.T, store idem.Store, c idem.Tracer, w *obsload.Workload) (http.Handler, *idem.Engine) {
	t.Helper()
	engine, err := idem.NewEngine(store, &idem.Config{Tracer: c, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { engine.Close(context.Background()) })
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+obsload.Route, mw.Handler(w.App()))
	return mux, engine
}

// TestWorkloadCounts checks that after a known workload every counter
// says exactly what happened.
func TestWorkloadCounts(t *testing.T) {
	c, reg := newCollector(t)
	w := &obsload.Workload{Fresh: 7, Replays: 5, Duplicates: 4, Prefix: "wl"}
	h, _ := server(t, idemmem.NewStore(nil), c, w)
	n := w.Run(t, obsload.InProcess(h))
	m := metrics(t, reg)
	req := func(outcome string) string {
		return "idem_requests_total{method=POST,outcome=" + outcome + ",route=/orders}"
	}
	op := func(outcome string) string { return "idem_operations_total{outcome=" + outcome + ",store=memory}" }
	call := func(name, result string) string {
		return "idem_store_operation_duration_seconds_count{operation=" + name + ",result=" + result + ",store=memory}"
	}
	want(t, m, map[string]float64{
		req("executed"):             float64(n.Executed),
		req("replayed"):             float64(n.Replayed),
		req("in_flight"):            float64(n.InFlight),
		req("fingerprint_mismatch"): float64(n.FingerprintMismatch),
		req("passthrough"):          0,
		op("executed"):              float64(n.Executed),
		op("replayed"):              float64(n.Replayed),
		op("in_flight"):             float64(n.InFlight),
		op("fingerprint_mismatch"):  float64(n.FingerprintMismatch),
		call("claim", "ok"):         float64(n.Claims),
		call("begin", "ok"):         float64(n.Completions),
		call("complete", "ok"):      float64(n.Completions),
		call("claim", "error"):      0,
		call("release", "ok"):       0,
		"idem_execution_duration_seconds_count{outcome=executed,route=/orders}": float64(n.Executed),
		"idem_stored_response_bytes_count":                                      float64(n.Executed),
		"idem_stored_response_bytes_sum":                                        float64(n.Executed * len(obsload.Body)),
		"idem_replay_age_seconds_count":                                         float64(n.Replayed),
		"idem_in_flight":                                                        0,
		"idem_lease_takeovers_total":                                            0,
		"idem_lease_lost_total":                                                 0,
	})
	if n.Executed != 8 || n.Replayed != 5 || n.InFlight != 3 || n.FingerprintMismatch != 1 {
		t.Fatalf("workload = %+v", n)
	}
}

// TestRequestOutcomes covers the refusals made before the engine, and a
// request passing through without a key.
func TestRequestOutcomes(t *testing.T) {
	c, reg := newCollector(t)
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: c, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: quiet, MaxRequestBody: 8})
	if err != nil {
		t.Fatal(err)
	}
	// The middleware outside the router: the route is learned once the
	// router ran.
	mux := http.NewServeMux()
	mux.HandleFunc("POST /items/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	mux.HandleFunc("POST /gone", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) })
	mux.HandleFunc("POST /boom", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	h := mw.Handler(mux)
	send := func(target, key, body string) int {
		r := httptest.NewRequest(http.MethodPost, target, strings.NewReader(body))
		if key != "" {
			r.Header.Set(idemhttp.HeaderKey, key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	send("/items/1", "", "")            // passthrough
	send("/items/1", "a,b", "")         // invalid key
	send("/items/2", "k1", "123456789") // too large
	send("/items/3", "k2", "")          // executed
	send("/gone", "k3", "")             // 404: not executed
	send("/boom", "k4", "")             // panic
	// Answered without running the router: the router still names the
	// route, not "unmatched".
	send("/items/3", "k2", "")      // replayed
	send("/items/3", "k2", "other") // fingerprint mismatch
	send("/nowhere", "k5", "")      // the mux's 404, not stored
	m := metrics(t, reg)
	want(t, m, map[string]float64{
		"idem_requests_total{method=POST,outcome=passthrough,route=/items/{id}}":          1,
		"idem_requests_total{method=POST,outcome=invalid_key,route=/items/{id}}":          1,
		"idem_requests_total{method=POST,outcome=request_too_large,route=/items/{id}}":    1,
		"idem_requests_total{method=POST,outcome=executed,route=/items/{id}}":             1,
		"idem_requests_total{method=POST,outcome=replayed,route=/items/{id}}":             1,
		"idem_requests_total{method=POST,outcome=fingerprint_mismatch,route=/items/{id}}": 1,
		"idem_requests_total{method=POST,outcome=not_executed,route=unmatched}":           1,
		"idem_requests_total{method=POST,outcome=not_executed,route=/gone}":               1,
		"idem_requests_total{method=POST,outcome=handler_panic,route=/boom}":              1,
		"idem_operations_total{outcome=handler_panic,store=memory}":                       1,
		"idem_operations_total{outcome=not_executed,store=memory}":                        2,
		// The releases of the two 404s; after the panic, a store without
		// transactions keeps the key until its lease ends.
		"idem_store_operation_duration_seconds_count{operation=release,result=ok,store=memory}": 2,
		"idem_execution_duration_seconds_count{outcome=executed,route=/items/{id}}":             1,
	})
}

// clock is a settable time for idemmem, so that leases and retention end
// when the test says.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestLeaseLostAndTakeover: an execution outlives its lease, a retry
// takes the key over and completes, the first one's completion is
// refused. One takeover, one lost lease.
func TestLeaseLostAndTakeover(t *testing.T) {
	c, reg := newCollector(t)
	clk := &clock{now: time.Unix(1e9, 0)}
	engine, err := idem.NewEngine(idemmem.NewStore(&idemmem.Config{NowFunc: clk.Now}), &idem.Config{
		Tracer: c, Logger: quiet, Lease: time.Minute, Heartbeat: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	op := idem.Operation{Key: "k"}
	running, finish := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		_, err := engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			close(running)
			<-finish
			return idem.Result{Status: 201}, nil
		})
		first <- err
	}()
	<-running
	clk.Add(2 * time.Minute) // the first lease has ended
	takeover := false
	out, err := engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
		x, _ := idem.ExecutionFromContext(ctx)
		takeover = x.Takeover
		return idem.Result{Status: 201, Body: []byte("ok")}, nil
	})
	if err != nil || out.Replayed {
		t.Fatalf("takeover: %v, %+v", err, out)
	}
	close(finish)
	if err := <-first; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("first execution: %v, want ErrLeaseLost", err)
	}
	// A takeover is counted when the store reports one, as the execution
	// sees it.
	takeovers := 0.0
	if takeover {
		takeovers = 1
	}
	want(t, metrics(t, reg), map[string]float64{
		"idem_lease_takeovers_total":                             takeovers,
		"idem_lease_lost_total":                                  1,
		"idem_operations_total{outcome=lease_lost,store=memory}": 1,
		"idem_operations_total{outcome=executed,store=memory}":   1,
		"idem_store_operation_duration_seconds_count{operation=complete,result=lease_lost,store=memory}": 1,
	})
}

// failingExtends is an idemmem store whose extensions fail with a store
// error (not a lost lease) while failing is set.
type failingExtends struct {
	*idemmem.Store
	failing atomic.Bool
	calls   atomic.Int64
}

func (s *failingExtends) Extend(ctx context.Context, p idem.ExtendParams) error {
	s.calls.Add(1)
	if s.failing.Load() {
		return errors.New("connection refused")
	}
	return s.Store.Extend(ctx, p)
}

// TestHeartbeatFailures counts the failed extensions, each of them.
func TestHeartbeatFailures(t *testing.T) {
	c, reg := newCollector(t)
	store := &failingExtends{Store: idemmem.NewStore(nil)}
	store.failing.Store(true)
	engine, err := idem.NewEngine(store, &idem.Config{Tracer: c, Logger: quiet, Lease: 300 * time.Millisecond, Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	_, err = engine.Do(context.Background(), idem.Operation{Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		for metrics(t, reg)["idem_heartbeat_failures_total"] < 3 {
			time.Sleep(time.Millisecond)
		}
		store.failing.Store(false)
		return idem.Result{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := engine.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	m := metrics(t, reg)
	failed := m["idem_store_operation_duration_seconds_count{operation=extend,result=error,store=memory}"]
	// Every failed extension is a failed store call; it is a heartbeat
	// failure while the handler runs. One may have been under way as the
	// handler returned.
	if beats := m["idem_heartbeat_failures_total"]; beats < 3 || failed-beats < 0 || failed-beats > 1 {
		t.Fatalf("heartbeat failures %v, extend errors %v: want at least 3, and one less at most", beats, failed)
	}
}

// TestPurge counts the records the janitor deleted.
func TestPurge(t *testing.T) {
	c, reg := newCollector(t)
	clk := &clock{now: time.Unix(1e9, 0)}
	store := idemmem.NewStore(&idemmem.Config{NowFunc: clk.Now})
	engine, err := idem.NewEngine(store, &idem.Config{Tracer: c, Logger: quiet, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 25 {
		if _, err := engine.Do(context.Background(), idem.Operation{Key: fmt.Sprint("k", i)}, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(2 * time.Hour)
	j, err := idemjanitor.NewJanitor(store, &idemjanitor.Config{Tracer: c, BatchSize: 10, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	n, err := j.PurgeOnce(context.Background())
	if err != nil || n != 25 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	m := metrics(t, reg)
	want(t, m, map[string]float64{
		"idem_purged_records_total":          25,
		"idem_purge_batches_total":           3,
		"idem_purge_passes_total{result=ok}": 1,
		"idem_store_operation_duration_seconds_count{operation=purge,result=ok,store=memory}": 3,
	})
	if m["idem_purge_last_success_timestamp_seconds"] == 0 {
		t.Error("no last success time")
	}
}

// TestInbox counts messages by consumer and action.
func TestInbox(t *testing.T) {
	c, reg := newCollector(t)
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Tracer: c, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	in, err := ideminbox.NewInbox(engine, &ideminbox.Config{Consumer: "billing", Tracer: c})
	if err != nil {
		t.Fatal(err)
	}
	ok := func(ctx context.Context) error { return nil }
	for _, id := range []string{"m1", "m1", "m2", ""} {
		in.Process(context.Background(), ideminbox.Message{ID: id, Attempt: 1}, ok) //nolint:errcheck // the action is what is counted
	}
	in.Process(context.Background(), ideminbox.Message{ID: "m3", Attempt: 1}, func(ctx context.Context) error { return errors.New("no") }) //nolint:errcheck
	want(t, metrics(t, reg), map[string]float64{
		"idem_inbox_messages_total{action=ack,consumer=billing}":           2,
		"idem_inbox_messages_total{action=ack-duplicate,consumer=billing}": 1,
		"idem_inbox_messages_total{action=reject,consumer=billing}":        1,
		"idem_inbox_messages_total{action=nack,consumer=billing}":          1,
		"idem_inbox_messages_total{action=hold,consumer=billing}":          0,
	})
}

// TestClient counts idemclient's attempts and retries.
func TestClient(t *testing.T) {
	c, reg := newCollector(t)
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		switch calls.Add(1) {
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusConflict)
		case 3:
			w.WriteHeader(http.StatusCreated)
		default:
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(http.StatusCreated)
		}
	}))
	defer srv.Close()
	client := idemclient.NewClient(&idemclient.Transport{Tracer: c, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond})
	for range 2 {
		resp, err := client.Post(srv.URL, "application/json", strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	want(t, metrics(t, reg), map[string]float64{
		"idem_client_attempts_total{outcome=unavailable}": 1,
		"idem_client_attempts_total{outcome=in_flight}":   1,
		"idem_client_attempts_total{outcome=response}":    1,
		"idem_client_attempts_total{outcome=replayed}":    1,
		"idem_client_retries_total{reason=unavailable}":   1,
		"idem_client_retries_total{reason=in_flight}":     1,
		"idem_client_retries_total{reason=error}":         0,
	})
}

// TestRegisterTwice: a second collector on one registry is refused.
func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg}); err != nil {
		t.Fatal(err)
	}
	if _, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg}); err == nil {
		t.Fatal("second collector registered on the same registry")
	}
}

// TestMaxRoutes: routes past the bound are counted as "other".
func TestMaxRoutes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg, MaxRoutes: 2})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		c.TraceRequestEnd(context.Background(), idemfront.TraceRequestEndData{Method: "POST", Route: fmt.Sprint("/r", i), Kind: idemfront.Executed})
	}
	want(t, metrics(t, reg), map[string]float64{
		"idem_requests_total{method=POST,outcome=executed,route=/r0}":   1,
		"idem_requests_total{method=POST,outcome=executed,route=/r1}":   1,
		"idem_requests_total{method=POST,outcome=executed,route=other}": 3,
	})
}
