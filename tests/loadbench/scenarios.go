package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// scenario is one of the measured loads.
type scenario struct {
	id     string // the letter in docs/BENCHMARKS.md (a, b, c, d), or b' and e
	name   string
	route  string
	replay bool // every request reuses a completed key
	// base is the id of the scenario its ratios are taken against; ""
	// means (a), the bare handler.
	base string
}

var baseScenarios = []scenario{
	{id: "a", name: "bare handler", route: routeBare},
	{id: "b", name: "idem, fresh keys", route: routeIdem},
	{id: "c", name: "idem, replays", route: routeIdem, replay: true},
	{id: "d", name: "naive check-then-write", route: routeNaive},
}

var variantScenario = scenario{id: "b'", name: "idem, fresh keys, -variant schema", route: routeVariant}

// scenarioByID returns the base scenario named id.
func scenarioByID(id string) scenario {
	i := slices.IndexFunc(baseScenarios, func(sc scenario) bool { return sc.id == id })
	return baseScenarios[i]
}

var oneTxScenario = scenario{id: "e", name: "one-transaction claim (not idem's design; -onetx)", route: routeOneTx}

// requestBody is the same for every request, so that a replay's
// fingerprint matches the execution it replays.
var requestBody = []byte(`{"cart_id":"cart_42","total_cents":1200}`)

// phase is the outcome of one scenario in one round: the sum of its
// slices.
type phase struct {
	scenario  scenario
	round     int
	requests  int
	failures  int // no answer, or an answer ≥ 400
	replays   int // answers marked Idempotent-Replayed
	statuses  map[int]int
	errors    map[string]int
	elapsed   time.Duration
	latencies []time.Duration // of answered requests
	// writes and reads to PostgreSQL: writes per request is its round
	// trips, see countingConn.
	writes, reads int64
	cpu           cpuSample // CPU spent during the slices, see cpu.go
}

func (p *phase) throughput() float64 {
	if p.elapsed <= 0 {
		return 0
	}
	return float64(p.requests) / p.elapsed.Seconds()
}

// percentile is the nearest-rank percentile q (0 < q ≤ 1) of the latencies.
func (p *phase) percentile(q float64) time.Duration {
	if len(p.latencies) == 0 {
		return 0
	}
	s := slices.Clone(p.latencies)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s))-1e-9)) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func (p *phase) perRequest(n int64) float64 {
	if p.requests == 0 {
		return 0
	}
	return float64(n) / float64(p.requests)
}

// bench holds what every phase shares.
type bench struct {
	db         *database
	variant    *database // nil without -variant
	variantSQL string
	rtt        time.Duration // -rtt
	// claimBatch and variantClaimBatch are the -claim-batch flags.
	claimBatch, variantClaimBatch int
	// claimConcurrency and variantClaimConcurrency are the
	// -claim-concurrency flags.
	claimConcurrency, variantClaimConcurrency int
	scenarios                                 []scenario
	baseURL                                   string
	clients                                   int
	duration                                  time.Duration
	client                                    *http.Client
	runID                                     string       // prefixes the keys, unique per run
	seq                                       atomic.Int64 // numbers the fresh keys
}

func newClient(clients int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Keep-alive for every client at once: a new TCP connection per
	// request would measure the handshake, not the routes.
	tr.MaxIdleConns = 2 * clients
	tr.MaxIdleConnsPerHost = 2 * clients
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func (b *bench) databases() []*database {
	if b.variant != nil {
		return []*database{b.db, b.variant}
	}
	return []*database{b.db}
}

// backends returns the backends of every pool: a phase loads only one of
// them, the others' backends are idle and add nothing.
func (b *bench) backends() []uint32 {
	var pids []uint32
	for _, db := range b.databases() {
		pids = append(pids, db.backends()...)
	}
	return pids
}

func (b *bench) writes() int64 {
	var n int64
	for _, db := range b.databases() {
		n += db.writes.Load()
	}
	return n
}

func (b *bench) reads() int64 {
	var n int64
	for _, db := range b.databases() {
		n += db.reads.Load()
	}
	return n
}

// post sends one order with key and returns the status and whether the
// answer was a replay.
func (b *bench) post(ctx context.Context, route, key string) (int, bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.baseURL+route, bytes.NewReader(requestBody))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed) == "true", err
}

// round runs every scenario for duration, interleaved: the duration is
// cut into slices, and each slice runs every scenario once, in an order
// rotated from slice to slice. The other tenants of a shared machine come
// and go within seconds; interleaving gives every scenario the same share
// of their noise, where ten seconds of one then ten of the next would
// not.
func (b *bench) round(ctx context.Context, r int, duration, slice time.Duration) ([]*phase, error) {
	phases := make([]*phase, len(b.scenarios))
	for i, sc := range b.scenarios {
		phases[i] = &phase{scenario: sc, round: r, statuses: map[int]int{}, errors: map[string]int{}}
	}
	// One completed key per client, made before the clock starts, so that
	// every measured replay request is a replay.
	// Per route: each replay scenario replays keys its own route made.
	replayKeys := map[string][]string{}
	for _, sc := range b.scenarios {
		if !sc.replay || replayKeys[sc.route] != nil {
			continue
		}
		keys := make([]string, b.clients)
		for i := range keys {
			keys[i] = fmt.Sprintf("replay-%s-r%d-%d-%s", b.runID, r, i, sc.id)
			status, _, err := b.post(ctx, sc.route, keys[i])
			if err != nil {
				return nil, err
			}
			if status != http.StatusCreated {
				return nil, fmt.Errorf("preparing replay key: status %d", status)
			}
		}
		replayKeys[sc.route] = keys
	}
	n := max(int(duration/slice), 1)
	for s := range n {
		for i := range phases {
			p := phases[(i+s+r)%len(phases)]
			var keys []string
			if p.scenario.replay {
				keys = replayKeys[p.scenario.route]
			}
			if err := b.slice(ctx, p, keys, duration/time.Duration(n)); err != nil {
				return nil, err
			}
		}
	}
	return phases, nil
}

// sample is one request's outcome.
type sample struct {
	latency  time.Duration
	status   int
	replayed bool
	err      error
}

// slice drives p's route from every client for d, each client sending
// one request at a time over its kept-alive connection, with a fresh key
// per request, or with keys[client] when keys is not nil. In-flight
// requests at the end are waited for and counted.
//
// This is idemcheck.Load's loop; it is written out here because pooling
// percentiles over many slices needs every latency, which LoadReport
// summarises away.
func (b *bench) slice(ctx context.Context, p *phase, keys []string, d time.Duration) error {
	backends := b.backends()
	w0, r0, c0 := b.writes(), b.reads(), sampleCPU(backends)
	start := time.Now()
	deadline := start.Add(d)
	results := make([][]sample, b.clients)
	var wg sync.WaitGroup
	for w := range b.clients {
		wg.Go(func() {
			// The label tells the clients' share of a -cpuprofile apart.
			pprof.Do(ctx, pprof.Labels("scenario", p.scenario.id), func(ctx context.Context) {
				for time.Now().Before(deadline) && ctx.Err() == nil {
					var key string
					if keys != nil {
						key = keys[w]
					} else {
						key = b.runID + "-" + strconv.FormatInt(b.seq.Add(1), 10)
					}
					t0 := time.Now()
					status, replayed, err := b.post(ctx, p.scenario.route, key)
					results[w] = append(results[w], sample{time.Since(t0), status, replayed, err})
				}
			})
		})
	}
	wg.Wait()
	p.elapsed += time.Since(start)
	p.cpu = p.cpu.add(sampleCPU(backends).sub(c0))
	p.writes += b.writes() - w0
	p.reads += b.reads() - r0
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, rs := range results {
		for _, s := range rs {
			p.requests++
			switch {
			case s.err != nil:
				p.failures++
				p.errors[s.err.Error()]++
				continue
			case s.status >= 400:
				p.failures++
			}
			p.statuses[s.status]++
			if s.replayed {
				p.replays++
			}
			p.latencies = append(p.latencies, s.latency)
		}
	}
	return nil
}

// pairs is the outcome of the duplicate-pair load on one route.
type pairs struct {
	scenario scenario
	round    int
	keys     int // keys sent, each by two clients at once
	fresh    int // 2xx answers not marked as replays
	replays  int
	conflict int // 409: the twin was in flight
	other    int // any other status, or no answer
	// From the orders table afterwards:
	orders        int // orders created by these keys
	duplicateKeys int // keys with more than one order
	extraOrders   int // orders beyond the first of their key
}

// runPairs sends every key from two clients released at the same instant,
// clients/2 pairs at a time, for duration, then counts the orders each
// key created. Two requests that meet in the handler at once are exactly
// the race a check-then-write cannot see.
func (b *bench) runPairs(ctx context.Context, sc scenario, round int, duration time.Duration) (*pairs, error) {
	prefix := fmt.Sprintf("dup-%s-r%d-%d", sc.id, round, time.Now().UnixNano())
	res := &pairs{scenario: sc, round: round}
	var mu sync.Mutex
	deadline := time.Now().Add(duration)
	var wg sync.WaitGroup
	for p := range max(b.clients/2, 1) {
		wg.Go(func() {
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				key := fmt.Sprintf("%s-%d-%d", prefix, p, n)
				start := make(chan struct{})
				type answer struct {
					status   int
					replayed bool
					err      error
				}
				answers := make(chan answer, 2)
				for range 2 {
					go func() {
						<-start
						s, r, err := b.post(ctx, sc.route, key)
						answers <- answer{s, r, err}
					}()
				}
				close(start)
				a1, a2 := <-answers, <-answers
				mu.Lock()
				res.keys++
				for _, a := range []answer{a1, a2} {
					switch {
					case a.err != nil:
						res.other++
					case a.status == http.StatusConflict:
						res.conflict++
					case a.status >= 200 && a.status < 300 && a.replayed:
						res.replays++
					case a.status >= 200 && a.status < 300:
						res.fresh++
					default:
						res.other++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if b.db.sql != nil {
		return res, countSQLOrders(ctx, b.db, prefix, res)
	}
	err := b.db.pool.QueryRow(ctx, `
		SELECT coalesce(sum(n), 0), count(*) FILTER (WHERE n > 1), coalesce(sum(n - 1), 0)
		FROM (SELECT count(*) AS n FROM orders WHERE idem_key LIKE $1 || '-%' GROUP BY idem_key) per_key`,
		prefix).Scan(&res.orders, &res.duplicateKeys, &res.extraOrders)
	return res, err
}
