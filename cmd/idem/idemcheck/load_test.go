package idemcheck

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// keyCounter answers 201 to a key's first request and a marked replay to
// the next ones, counting executions.
type keyCounter struct {
	mu   sync.Mutex
	keys map[string]int
}

func (k *keyCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get(DefaultKeyHeader)
	k.mu.Lock()
	k.keys[key]++
	n := k.keys[key]
	k.mu.Unlock()
	if n > 1 {
		w.Header().Set(headerReplayed, "true")
	}
	w.WriteHeader(http.StatusCreated)
}

func (k *keyCounter) distinct() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.keys)
}

func TestLoad(t *testing.T) {
	for _, replay := range []bool{false, true} {
		t.Run(map[bool]string{false: "fresh keys", true: "replay"}[replay], func(t *testing.T) {
			kc := &keyCounter{keys: map[string]int{}}
			srv := httptest.NewServer(kc)
			defer srv.Close()
			var progressed int
			rep, err := Load(context.Background(), LoadConfig{
				URL: srv.URL, Body: []byte("x"), Duration: 200 * time.Millisecond, Concurrency: 3, Replay: replay,
				ProgressFunc: func(LoadProgress) { progressed++ },
			})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Requests < 3 || rep.Failures != 0 || rep.Statuses[201] != rep.Requests {
				t.Fatalf("report %+v", rep)
			}
			if progressed == 0 {
				t.Error("ProgressFunc never called")
			}
			if replay {
				if kc.distinct() != 3 || rep.Replays != rep.Requests-3 {
					t.Errorf("replay mode: %d keys, %d replays of %d requests; want 3 keys, all but 3 replays", kc.distinct(), rep.Replays, rep.Requests)
				}
			} else if kc.distinct() != rep.Requests || rep.Replays != 0 {
				t.Errorf("fresh mode: %d keys for %d requests, %d replays; want one key each, no replay", kc.distinct(), rep.Requests, rep.Replays)
			}
			l := rep.Latency
			if !(l.Min <= l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max && l.Min > 0) {
				t.Errorf("latencies out of order: %+v", l)
			}
			total := 0
			for _, b := range rep.Histogram {
				total += b.Count
			}
			if total != rep.Requests {
				t.Errorf("histogram holds %d answers, want %d", total, rep.Requests)
			}
			var out bytes.Buffer
			WriteLoadReport(&out, rep)
			for _, want := range []string{"p99", "histogram", "×201"} {
				if !strings.Contains(out.String(), want) {
					t.Errorf("text report lacks %q:\n%s", want, out.String())
				}
			}
		})
	}
}

func TestLoadFailuresExitOne(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"--load", "--duration", "50ms", "--concurrency", "2", srv.URL}, &out, &errb)
	if code != ExitFail || !strings.Contains(out.String(), "×500") {
		t.Fatalf("exit %d, want %d:\n%s%s", code, ExitFail, out.String(), errb.String())
	}
	if errb.Len() != 0 {
		t.Errorf("progress written to a stderr that is not a terminal: %q", errb.String())
	}
}

func TestSummarise(t *testing.T) {
	var lat []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		lat = append(lat, time.Duration(i)*time.Millisecond)
	}
	s, h := summarise(lat)
	want := LatencySummary{Min: time.Millisecond, Mean: 50500 * time.Microsecond,
		P50: 50 * time.Millisecond, P90: 90 * time.Millisecond, P99: 99 * time.Millisecond, Max: 100 * time.Millisecond}
	if s != want {
		t.Fatalf("summary %+v, want %+v", s, want)
	}
	// Buckets ≤1ms, ≤2ms, ≤5ms, ≤10ms, ≤20ms, ≤50ms, ≤100ms.
	wantCounts := []int{1, 1, 3, 5, 10, 30, 50}
	if len(h) != len(wantCounts) {
		t.Fatalf("histogram %+v", h)
	}
	for i, b := range h {
		if b.Count != wantCounts[i] {
			t.Errorf("bucket ≤%v holds %d, want %d", b.UpTo, b.Count, wantCounts[i])
		}
	}
}

func TestProgressLine(t *testing.T) {
	got := progressLine(LoadProgress{Elapsed: 5 * time.Second, Duration: 10 * time.Second, Requests: 100, Failures: 2})
	if !strings.HasPrefix(got, "["+strings.Repeat("#", 15)+strings.Repeat(".", 15)+"]") ||
		!strings.Contains(got, "100 requests") || !strings.Contains(got, "20/s") || !strings.Contains(got, "2 failures") {
		t.Fatalf("progress line %q", got)
	}
}

func TestOtherBody(t *testing.T) {
	cases := map[string]string{
		`{"cart_id":"c_42"}`: "application/json",
		"a=1&b=2":            "application/x-www-form-urlencoded",
		"plain text":         "text/plain",
	}
	for body, ct := range cases {
		other, ok := otherBody([]byte(body), ct)
		if !ok || bytes.Equal(other, []byte(body)) {
			t.Errorf("otherBody(%q) = %q, %v: want a different body", body, other, ok)
		}
	}
	if _, ok := otherBody(nil, ""); ok {
		t.Error("otherBody of an empty body should report nothing to vary")
	}
}

func TestLoadUnreachable(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	var out, errb bytes.Buffer
	// A long duration: the run must give up on its own, not wait it out.
	code := Main(context.Background(), []string{"--load", "--duration", "10m", url}, &out, &errb)
	if code != ExitUsage || out.Len() != 0 || strings.Count(errb.String(), "\n") != 1 || !strings.Contains(errb.String(), "cannot reach") {
		t.Fatalf("exit %d, stdout %q, stderr %q; want %d and one line", code, out.String(), errb.String(), ExitUsage)
	}
}
