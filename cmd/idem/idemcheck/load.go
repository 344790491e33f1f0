package idemcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// LoadConfig says what load to send. URL is required; every zero field
// means its documented default.
type LoadConfig struct {
	// URL, Method, Body, Header and KeyHeader are as in Config; a
	// password in URL is never printed.
	URL       string
	Method    string
	Body      []byte
	Header    http.Header
	KeyHeader string

	// Duration is how long workers start new requests; requests in
	// flight at the end are waited for. Defaults to 10s.
	Duration time.Duration

	// Concurrency is the number of workers, each sending one request at a
	// time. Defaults to 16.
	Concurrency int

	// Replay gives each worker one key for all its requests: the first
	// executes, every later one is a replay. Defaults to false: a fresh
	// key per request, every request an execution.
	Replay bool

	// Timeout bounds each request. Defaults to 10s.
	Timeout time.Duration

	// Client sends the requests. Defaults as in Config.
	Client *http.Client

	// KeyFunc makes the keys. Defaults to random UUIDv4s.
	KeyFunc func() string

	// ProgressFunc, when set, is called about every ProgressInterval while
	// the load runs, from a goroutine of its own, and once at the end.
	ProgressFunc func(LoadProgress)

	// ProgressInterval defaults to 200ms.
	ProgressInterval time.Duration
}

// LoadProgress is a snapshot of a running load.
type LoadProgress struct {
	Elapsed  time.Duration
	Duration time.Duration
	Requests int64 // requests answered so far
	Failures int64 // requests without an answer or answered 4xx/5xx
}

// LoadReport is the outcome of Load.
type LoadReport struct {
	URL         string
	Method      string
	Concurrency int
	Replay      bool
	// Elapsed is the wall time from the first request to the last answer.
	Elapsed time.Duration
	// Requests counts every request sent and finished.
	Requests int
	// Statuses counts the answers by status code.
	Statuses map[int]int
	// Errors counts requests that got no answer, by error text.
	Errors map[string]int
	// Replays counts answers marked Idempotent-Replayed: true.
	Replays int
	// Failures counts requests without an answer or answered 4xx/5xx.
	Failures int
	// Throughput is Requests per second of Elapsed.
	Throughput float64
	// Latency summarises the latencies of answered requests.
	Latency LatencySummary
	// Histogram counts answered requests by latency, in buckets whose
	// upper bounds follow a 1-2-5 series, from the first non-empty bucket
	// to the last.
	Histogram []Bucket
	// Interrupted is true when the context ended before Duration.
	Interrupted bool
}

// LatencySummary gives the percentiles of a set of latencies.
type LatencySummary struct {
	Min, Mean, P50, P90, P99, Max time.Duration
}

// Bucket is one bar of a latency histogram: the answers whose latency is
// at most UpTo and more than the previous bucket's UpTo.
type Bucket struct {
	UpTo  time.Duration
	Count int
}

// Load sends requests as LoadConfig says and measures them. It returns an
// error only for an unusable configuration; a target that fails requests
// gives a report with Failures and Errors, and one that answers none of
// them an error wrapping ErrUnreachable.
func Load(ctx context.Context, config LoadConfig) (*LoadReport, error) {
	if config.Concurrency < 0 {
		return nil, fmt.Errorf("concurrency must be positive, got %d", config.Concurrency)
	}
	if config.Concurrency == 0 {
		config.Concurrency = DefaultLoadConcurrency
	}
	c, err := newChecker(Config{
		URL: config.URL, Method: config.Method, Body: config.Body, Header: config.Header,
		KeyHeader: config.KeyHeader, Concurrency: max(config.Concurrency, 2), Timeout: config.Timeout,
		Client: config.Client, KeyFunc: config.KeyFunc,
	})
	if err != nil {
		return nil, err
	}
	defer c.closeIdle()
	if config.Duration <= 0 {
		config.Duration = DefaultLoadDuration
	}
	if config.ProgressInterval <= 0 {
		config.ProgressInterval = 200 * time.Millisecond
	}

	var requests, failures atomic.Int64
	type sample struct {
		latency  time.Duration
		status   int
		replayed bool
		err      string
	}
	perWorker := make([][]sample, config.Concurrency)
	start := time.Now()
	deadline := start.Add(config.Duration)
	progress := func() {
		if config.ProgressFunc != nil {
			config.ProgressFunc(LoadProgress{Elapsed: time.Since(start), Duration: config.Duration,
				Requests: requests.Load(), Failures: failures.Load()})
		}
	}
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		tick := time.NewTicker(config.ProgressInterval)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				progress()
			case <-stopProgress:
				return
			}
		}
	}()

	// A target that answers nothing is unreachable: give up after one
	// failed request per worker rather than spin on refused connections
	// for the whole Duration.
	runCtx, abort := context.WithCancel(ctx)
	defer abort()
	var answered, unanswered atomic.Int64
	var wg sync.WaitGroup
	for w := range config.Concurrency {
		wg.Go(func() {
			key := ""
			if config.Replay {
				key = c.KeyFunc()
			}
			for time.Now().Before(deadline) && runCtx.Err() == nil {
				if !config.Replay {
					key = c.KeyFunc()
				}
				t0 := time.Now()
				s := sample{}
				status, replayed, err := c.sendDiscard(runCtx, key)
				s.latency = time.Since(t0)
				if err != nil {
					if runCtx.Err() != nil {
						return // interrupted: not the target's failure
					}
					s.err = errText(err)
					failures.Add(1)
					if unanswered.Add(1) >= int64(config.Concurrency) && answered.Load() == 0 {
						abort()
					}
				} else {
					answered.Add(1)
					s.status, s.replayed = status, replayed
					if status >= 400 {
						failures.Add(1)
					}
				}
				requests.Add(1)
				perWorker[w] = append(perWorker[w], s)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stopProgress)
	<-progressDone
	progress()

	rep := &LoadReport{URL: c.secrets.text(shownURL(c.URL)), Method: safeText(c.Method), Concurrency: config.Concurrency, Replay: config.Replay,
		Elapsed: elapsed, Statuses: map[int]int{}, Errors: map[string]int{}, Interrupted: ctx.Err() != nil}
	var latencies []time.Duration
	for _, samples := range perWorker {
		for _, s := range samples {
			rep.Requests++
			if s.err != "" {
				rep.Errors[c.secrets.scrub(s.err, true)]++
				rep.Failures++
				continue
			}
			rep.Statuses[s.status]++
			if s.status >= 400 {
				rep.Failures++
			}
			if s.replayed {
				rep.Replays++
			}
			latencies = append(latencies, s.latency)
		}
	}
	if len(latencies) == 0 && len(rep.Errors) > 0 && !rep.Interrupted {
		for e := range rep.Errors {
			return nil, safeErr(fmt.Errorf("%w %s: %s", ErrUnreachable, redactURL(c.URL), e), c.secrets)
		}
	}
	if elapsed > 0 {
		rep.Throughput = float64(rep.Requests) / elapsed.Seconds()
	}
	rep.Latency, rep.Histogram = summarise(latencies)
	return rep, nil
}

// sendDiscard sends one request and reads its answer (so the connection
// is reused) without keeping it, up to maxReadBody: a longer body is cut
// and its connection closed.
func (c *checker) sendDiscard(ctx context.Context, key string) (int, bool, error) {
	req, err := c.newRequest(ctx, key, c.Body)
	if err != nil {
		return 0, false, err
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, io.LimitReader(resp.Body, maxReadBody)); err != nil {
		return 0, false, err
	}
	a := answer{status: resp.StatusCode, header: resp.Header}
	return resp.StatusCode, a.replayed(), nil
}

// summarise computes exact percentiles (nearest rank) and a 1-2-5
// histogram of latencies.
func summarise(latencies []time.Duration) (LatencySummary, []Bucket) {
	if len(latencies) == 0 {
		return LatencySummary{}, nil
	}
	sorted := slices.Clone(latencies)
	slices.Sort(sorted)
	rank := func(p float64) time.Duration {
		// Nearest rank; the epsilon keeps 0.9×100 from rounding up to 91.
		i := int(math.Ceil(p*float64(len(sorted))-1e-9)) - 1
		return sorted[min(max(i, 0), len(sorted)-1)]
	}
	var sum time.Duration
	for _, l := range sorted {
		sum += l
	}
	s := LatencySummary{
		Min: sorted[0], Mean: sum / time.Duration(len(sorted)),
		P50: rank(0.50), P90: rank(0.90), P99: rank(0.99), Max: sorted[len(sorted)-1],
	}

	var buckets []Bucket
	i := 0
	for _, upTo := range bounds(s.Max) {
		n := 0
		for i < len(sorted) && sorted[i] <= upTo {
			n++
			i++
		}
		buckets = append(buckets, Bucket{UpTo: upTo, Count: n})
	}
	first := slices.IndexFunc(buckets, func(b Bucket) bool { return b.Count > 0 })
	last := len(buckets) - 1
	for buckets[last].Count == 0 {
		last--
	}
	return s, buckets[first : last+1]
}

// bounds are the 1-2-5 series from 10µs up to the first bound at or above
// top.
func bounds(top time.Duration) []time.Duration {
	var out []time.Duration
	for decade := 10 * time.Microsecond; ; decade *= 10 {
		for _, m := range []time.Duration{1, 2, 5} {
			out = append(out, decade*m)
			if decade*m >= top {
				return out
			}
		}
	}
}

// MarshalJSON writes durations in milliseconds, statuses as strings, for
// readers that are not Go programs.
func (r *LoadReport) MarshalJSON() ([]byte, error) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	type bucket struct {
		UpToMS float64 `json:"up_to_ms"`
		Count  int     `json:"count"`
	}
	statuses := map[string]int{}
	for k, v := range r.Statuses {
		statuses[strconv.Itoa(k)] = v
	}
	out := struct {
		URL         string             `json:"url"`
		Method      string             `json:"method"`
		Concurrency int                `json:"concurrency"`
		Replay      bool               `json:"replay"`
		ElapsedS    float64            `json:"elapsed_s"`
		Requests    int                `json:"requests"`
		Failures    int                `json:"failures"`
		Replays     int                `json:"replays"`
		Throughput  float64            `json:"throughput_rps"`
		Statuses    map[string]int     `json:"statuses"`
		Errors      map[string]int     `json:"errors,omitempty"`
		LatencyMS   map[string]float64 `json:"latency_ms"`
		Histogram   []bucket           `json:"histogram"`
		Interrupted bool               `json:"interrupted,omitempty"`
	}{
		URL: r.URL, Method: r.Method, Concurrency: r.Concurrency, Replay: r.Replay,
		ElapsedS: r.Elapsed.Seconds(), Requests: r.Requests, Failures: r.Failures, Replays: r.Replays,
		Throughput: r.Throughput, Statuses: statuses, Errors: r.Errors,
		LatencyMS: map[string]float64{
			"min": ms(r.Latency.Min), "mean": ms(r.Latency.Mean), "p50": ms(r.Latency.P50),
			"p90": ms(r.Latency.P90), "p99": ms(r.Latency.P99), "max": ms(r.Latency.Max),
		},
		Interrupted: r.Interrupted,
	}
	for _, b := range r.Histogram {
		out.Histogram = append(out.Histogram, bucket{UpToMS: ms(b.UpTo), Count: b.Count})
	}
	return json.Marshal(out)
}
