package idemhttp_test

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

	"github.com/idem-go/idem"

	"github.com/idem-go/idem/idemhttp"
)

// benchHandler is a typical small JSON create: it reads the body and
// answers 201 with a Location and a short body.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	h := w.Header()
	h["Content-Type"] = []string{"application/json"}
	h["Location"] = []string{"/orders/1"}
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"ord_1","amount":1200,"currency":"eur"}`)
})

// benchKeys is how many fresh keys a benchmark uses before it starts over
// on a new store: enough to leave the store's maps at their working size,
// few enough that the store's heap does not make the run a measure of the
// garbage collector scanning it.
const benchKeys = 1 << 12

const benchBody = `{"amount":1200,"currency":"eur","customer":"cus_123"}`

// benchRequest returns a reusable request: its body is rewound before
// each use so the loop measures the middleware, not the request's set-up.
func benchRequest(key string) (*http.Request, *strings.Reader) {
	body := strings.NewReader(benchBody)
	r := httptest.NewRequest(http.MethodPost, "/orders?expand=customer", body)
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer "+testTenant)
	if key != "" {
		r.Header.Set(idemhttp.HeaderKey, key)
	}
	return r, body
}

// cpuTime returns the CPU time the process has used, GC included.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds cpu-ns/op: the process's CPU time per operation. On a
// shared machine ns/op counts the time spent waiting for a core too; the
// CPU time does not.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

// BenchmarkBareHandler is the baseline: the handler alone.
func BenchmarkBareHandler(b *testing.B) {
	r, body := benchRequest("")
	w := httptest.NewRecorder()
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		body.Reset(benchBody)
		w.Body.Reset()
		clear(w.Header())
		benchHandler.ServeHTTP(w, r)
	}
}

// BenchmarkFirstExecution is one fresh key per iteration: claim, run,
// complete, deliver.
func BenchmarkFirstExecution(b *testing.B) {
	e := newEnv(b, nil)
	h := e.handler(b, idemhttp.Config{}, benchHandler)
	r, body := benchRequest("")
	w := httptest.NewRecorder()
	keys := make([][]string, 0, benchKeys)
	for i := range cap(keys) {
		keys = append(keys, []string{"key-" + strconv.Itoa(i)})
	}
	i := 0
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		if i == len(keys) {
			// Keep the store from growing without bound over long runs;
			// a fresh store costs the same per claim.
			b.StopTimer()
			e = newEnv(b, nil)
			h = e.handler(b, idemhttp.Config{}, benchHandler)
			i = 0
			b.StartTimer()
		}
		r.Header[idemhttp.HeaderKey] = keys[i]
		i++
		body.Reset(benchBody)
		w.Body.Reset()
		clear(w.Header())
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d", w.Code)
		}
	}
}

// BenchmarkReplay replays one stored answer.
func BenchmarkReplay(b *testing.B) {
	e := newEnv(b, nil)
	h := e.handler(b, idemhttp.Config{}, benchHandler)
	r, body := benchRequest("replayed-key")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		body.Reset(benchBody)
		w.Body.Reset()
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
	if w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		b.Fatal("not a replay")
	}
}

// BenchmarkEngineOnly is Engine.Do on the memory store with a result like
// the one the middleware stores for benchHandler: the share of
// BenchmarkFirstExecution that is not the middleware's. With the
// heartbeat off it shows what the heartbeat's timer and context cost.
func BenchmarkEngineOnly(b *testing.B) {
	for _, bc := range []struct {
		name      string
		heartbeat time.Duration
	}{{"heartbeat=on", 0}, {"heartbeat=off", -1}} {
		b.Run(bc.name, func(b *testing.B) {
			config := &idem.Config{Heartbeat: bc.heartbeat}
			e := newEnv(b, config)
			keys := make([]string, 0, benchKeys)
			for i := range cap(keys) {
				keys = append(keys, "key-"+strconv.Itoa(i))
			}
			fp := make([]byte, 32)
			res := idem.Result{
				Status: http.StatusCreated,
				Header: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1"}},
				Body:   []byte(`{"id":"ord_1","amount":1200,"currency":"eur"}`),
			}
			fn := func(context.Context) (idem.Result, error) { return res, nil }
			ctx := context.Background()
			i := 0
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if i == len(keys) {
					b.StopTimer()
					e = newEnv(b, config)
					i = 0
					b.StartTimer()
				}
				if _, err := e.engine.Do(ctx, idem.Operation{Tenant: testTenant, Key: keys[i], Fingerprint: fp}, fn); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
