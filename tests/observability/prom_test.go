package observability

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemjanitor"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/internal/obsload"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// gather reads every series of reg: counters and gauges by name and
// labels ("idem_requests_total{method=POST,outcome=executed,route=/orders}"),
// histograms as name_count and name_sum.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
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

func check(t *testing.T, got, want map[string]float64) {
	t.Helper()
	names := make([]string, 0, len(want))
	for name := range want {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if got[name] != want[name] {
			t.Errorf("%s = %v, want %v", name, got[name], want[name])
		}
	}
}

// TestPrometheusCountsExactly runs the workload (fresh keys, replays,
// duplicates released by one barrier, a key reused with another body)
// through idemhttp on each real store, then a lease lost to a takeover
// and a purge, and checks that every count is what happened.
func TestPrometheusCountsExactly(t *testing.T) {
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c, err := idemprom.NewCollector(&idemprom.Config{Registerer: reg})
			if err != nil {
				t.Fatal(err)
			}
			s := st.open(t)
			engine, err := idem.NewEngine(s, &idem.Config{Tracer: c, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer engine.Close(context.Background())
			mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{SharedKeySpace: true, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			w := &obsload.Workload{Fresh: 12, Replays: 9, Duplicates: 6, Prefix: "exact"}
			mux := http.NewServeMux()
			mux.Handle("POST "+obsload.Route, mw.Handler(w.App()))
			n := w.Run(t, obsload.InProcess(mux))

			req := func(o string) string { return "idem_requests_total{method=POST,outcome=" + o + ",route=/orders}" }
			op := func(o string) string { return "idem_operations_total{outcome=" + o + ",store=" + st.name + "}" }
			call := func(o, r string) string {
				return "idem_store_operation_duration_seconds_count{operation=" + o + ",result=" + r + ",store=" + st.name + "}"
			}
			check(t, gather(t, reg), map[string]float64{
				req("executed"):             float64(n.Executed),
				req("replayed"):             float64(n.Replayed),
				req("in_flight"):            float64(n.InFlight),
				req("fingerprint_mismatch"): float64(n.FingerprintMismatch),
				req("store_unavailable"):    0,
				op("executed"):              float64(n.Executed),
				op("replayed"):              float64(n.Replayed),
				op("in_flight"):             float64(n.InFlight),
				op("fingerprint_mismatch"):  float64(n.FingerprintMismatch),
				call("claim", "ok"):         float64(n.Claims),
				call("claim", "error"):      0,
				call("begin", "ok"):         float64(n.Completions),
				call("complete", "ok"):      float64(n.Completions),
				call("release", "ok"):       0,
				"idem_execution_duration_seconds_count{outcome=executed,route=/orders}": float64(n.Executed),
				"idem_stored_response_bytes_count":                                      float64(n.Executed),
				"idem_stored_response_bytes_sum":                                        float64(n.Executed * len(obsload.Body)),
				"idem_replay_age_seconds_count":                                         float64(n.Replayed),
				"idem_in_flight":                                                        0,
			})
			if n.Executed != 13 || n.Replayed != 9 || n.InFlight != 5 || n.FingerprintMismatch != 1 {
				t.Fatalf("workload: %+v", n)
			}

			leaseLost(t, s, c, reg, st.name)
			purge(t, s, c, reg, st.name)
		})
	}
}

// leaseLost runs an execution past its lease (no heartbeat), lets a retry
// take the key over and complete, then lets the first one try to
// complete: one lost lease, counted once, and one takeover when the store
// reports it.
func leaseLost(t *testing.T, s idem.Store, c *idemprom.Collector, reg *prometheus.Registry, name string) {
	t.Helper()
	engine, err := idem.NewEngine(s, &idem.Config{Tracer: c, Logger: quiet, Lease: 300 * time.Millisecond, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close(context.Background())
	before := gather(t, reg)
	op := idem.Operation{Key: "lease-" + fmt.Sprint(time.Now().UnixNano())}
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
	takeover, inFlight := false, 0
	for {
		_, err := engine.Do(context.Background(), op, func(ctx context.Context) (idem.Result, error) {
			x, _ := idem.ExecutionFromContext(ctx)
			takeover = x.Takeover
			return idem.Result{Status: 201}, nil
		})
		if err == nil {
			break
		}
		if !errors.Is(err, idem.ErrInFlight) || inFlight == 3000 {
			close(finish)
			t.Fatalf("retry: %v after %d answers in flight", err, inFlight)
		}
		inFlight++
		time.Sleep(10 * time.Millisecond)
	}
	close(finish)
	if err := <-first; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("first execution: %v, want ErrLeaseLost", err)
	}
	after := gather(t, reg)
	delta := func(name string) float64 { return after[name] - before[name] }
	wantTakeover := 0.0
	if takeover {
		wantTakeover = 1
	}
	for name, want := range map[string]float64{
		"idem_lease_lost_total":                                        1,
		"idem_lease_takeovers_total":                                   wantTakeover,
		"idem_operations_total{outcome=lease_lost,store=" + name + "}": 1,
		"idem_operations_total{outcome=in_flight,store=" + name + "}":  float64(inFlight),
		"idem_store_operation_duration_seconds_count{operation=complete,result=lease_lost,store=" + name + "}": 1,
	} {
		if got := delta(name); got != want {
			t.Errorf("%s grew by %v, want %v", name, got, want)
		}
	}
}

// purge lets records expire and purges them: the purged count is what
// the passes deleted, every expired record of the store (none on Redis,
// which expires them itself).
func purge(t *testing.T, s idem.Store, c *idemprom.Collector, reg *prometheus.Registry, name string) {
	t.Helper()
	short, err := idem.NewEngine(s, &idem.Config{Tracer: c, Logger: quiet, Lease: 100 * time.Millisecond, Retention: 100 * time.Millisecond, Heartbeat: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close(context.Background())
	const records = 7
	for i := range records {
		if _, err := short.Do(context.Background(), idem.Operation{Key: fmt.Sprint("short-", i)}, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{Status: 201}, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	expired := records
	if name == "redis" {
		expired = 0
	}
	j, err := idemjanitor.NewJanitor(s, &idemjanitor.Config{Tracer: c, BatchSize: 5, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	before := gather(t, reg)
	deleted, passes := 0, 0
	for {
		n, err := j.PurgeOnce(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		deleted += n
		passes++
		if deleted >= expired {
			break
		}
		if passes == 3000 {
			t.Fatalf("%d records purged after %d passes, want %d", deleted, passes, expired)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if deleted != expired {
		t.Fatalf("purged %d records, want %d", deleted, expired)
	}
	after := gather(t, reg)
	delta := func(name string) float64 { return after[name] - before[name] }
	if got := delta("idem_purged_records_total"); got != float64(deleted) {
		t.Errorf("purged records grew by %v, the passes deleted %d", got, deleted)
	}
	if got := delta("idem_purge_passes_total{result=ok}"); got != float64(passes) {
		t.Errorf("purge passes grew by %v, want %d", got, passes)
	}
	batches := delta("idem_purge_batches_total")
	call := delta("idem_store_operation_duration_seconds_count{operation=purge,result=ok,store=" + name + "}")
	if batches < float64(passes) || call != batches {
		t.Errorf("%v purge batches and %v store purge calls for %d passes", batches, call, passes)
	}
}
