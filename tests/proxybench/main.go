// Command proxybench measures the overhead of idemproxy: the same load
// sent straight to an upstream that answers in -upstream-delay (5 ms by
// default), and through the proxy in front of it, with fresh keys and
// with replays, in one run, on SQLite and on Redis keys. Phases
// alternate for -rounds rounds, so that the machine's noise falls on
// every side alike, and the median round's throughput of each is
// reported with its ratio to direct.
//
//	go run ./proxybench -duration 3s -concurrency 32 -rounds 3
//
// Keep in mind that the proxy, the upstream and the load generator share
// the machine's cores: on a small machine the ratios measure the proxy's
// CPU cost as much as its latency.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmigrate"
	"github.com/idem-go/idem/idemproxy"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemsqlite"
)

func main() {
	duration := flag.Duration("duration", 3*time.Second, "length of each phase")
	concurrency := flag.Int("concurrency", 32, "concurrent clients")
	delay := flag.Duration("upstream-delay", 5*time.Millisecond, "how long the upstream takes to answer")
	rounds := flag.Int("rounds", 3, "rounds of alternating phases; the median is reported")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis for the Redis keys ('' skips them)")
	stores := flag.String("stores", "sqlite,redis", "stores to measure")
	flag.Parse()
	log.SetFlags(0)

	upstream := startUpstream(*delay)
	fmt.Printf("upstream answering in %s; %d clients; %s per phase; %d rounds; GOMAXPROCS %d; load average before: %s\n",
		*delay, *concurrency, *duration, *rounds, runtime.GOMAXPROCS(0), loadAverage())
	fmt.Printf("%-7s %-14s %10s %8s %10s\n", "store", "phase", "req/s", "ratio", "p50")
	for _, name := range strings.Split(*stores, ",") {
		store, closeStore, err := openStore(name, *redisURL)
		if err != nil {
			log.Fatalf("%s: %v", name, err)
		}
		proxy := startProxy(store, upstream)
		results := map[string][]result{}
		for round := range *rounds {
			// The round is in the fresh keys' tag: a key of an earlier
			// round would be a replay.
			results["direct"] = append(results["direct"], run(upstream, *concurrency, *duration, false, "direct"))
			results["proxy fresh"] = append(results["proxy fresh"], run(proxy, *concurrency, *duration, false, fmt.Sprintf("%s-fresh-%d", name, round)))
			results["proxy replays"] = append(results["proxy replays"], run(proxy, *concurrency, *duration, true, name+"-replay"))
		}
		base := median(results["direct"]).rate
		for _, phase := range []string{"direct", "proxy fresh", "proxy replays"} {
			m := median(results[phase])
			fmt.Printf("%-7s %-14s %10.0f %7.2fx %10s\n", name, phase, m.rate, m.rate/base, m.p50.Round(10*time.Microsecond))
		}
		closeStore()
	}
	fmt.Printf("load average after: %s\n", loadAverage())
}

// startUpstream serves the upstream: 201 and a small JSON body after
// delay, as a service whose work takes that long.
func startUpstream(delay time.Duration) string {
	var n atomic.Int64
	return serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck // read whole
		time.Sleep(delay)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d,"status":"created"}`, n.Add(1))
	}))
}

func serve(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, h) //nolint:errcheck // runs until exit
	return "http://" + ln.Addr().String()
}

func openStore(name, redisURL string) (idem.Store, func(), error) {
	switch name {
	case "sqlite":
		dir, err := os.MkdirTemp("", "proxybench")
		if err != nil {
			return nil, nil, err
		}
		db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"))
		if err != nil {
			return nil, nil, err
		}
		if err := idemmigrate.Migrate(context.Background(), db, idemmigrate.SQLite); err != nil {
			return nil, nil, err
		}
		st, err := idemsql.NewStore(db, idemsql.SQLite)
		return st, func() { closeSQL(db); os.RemoveAll(dir) }, err
	case "redis":
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, nil, err
		}
		rdb := redis.NewClient(opts)
		st, err := idemredis.NewStore(rdb, nil)
		return st, func() { rdb.Close() }, err
	}
	return nil, nil, fmt.Errorf("unknown store %q", name)
}

func closeSQL(db *sql.DB) { db.Close() }

func startProxy(store idem.Store, upstream string) string {
	engine, err := idem.NewEngine(store, &idem.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		log.Fatal(err)
	}
	u, _ := url.Parse(upstream)
	p, err := idemproxy.New(engine, &idemproxy.Config{Upstream: u,
		Middleware: idemhttp.Config{SharedKeySpace: true, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		log.Fatal(err)
	}
	return serve(p)
}

type result struct {
	rate float64
	p50  time.Duration
}

var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

// run sends POSTs from c clients for d: each with a fresh key, or, with
// replay, every client one key of its own, replayed after its first.
func run(base string, c int, d time.Duration, replay bool, tag string) result {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: c, MaxIdleConns: c}}
	var wg sync.WaitGroup
	lat := make([][]time.Duration, c)
	deadline := time.Now().Add(d)
	var failed atomic.Int64
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; time.Now().Before(deadline); j++ {
				key := fmt.Sprintf("%s-%s-%d-%d", runID, tag, i, j)
				if replay {
					key = fmt.Sprintf("%s-%s-%d", runID, tag, i)
				}
				req, _ := http.NewRequest(http.MethodPost, base+"/orders", strings.NewReader(`{"cart_id":"c_42","total_cents":1900}`))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body) //nolint:errcheck // read whole
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					failed.Add(1)
					continue
				}
				// A fresh key must run upstream, a replay must not.
				// A fresh key must reach the upstream; a replay, after the
				// key's first request, must not.
				replayed := resp.Header.Get("Idempotent-Replayed") == "true"
				if replay && j > 0 && !replayed || !replay && replayed {
					failed.Add(1)
				}
				lat[i] = append(lat[i], time.Since(start))
			}
		}()
	}
	wg.Wait()
	client.CloseIdleConnections()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if f := failed.Load(); f > 0 {
		log.Fatalf("%s: %d requests failed or were not answered as expected", tag, f)
	}
	if len(all) == 0 {
		return result{}
	}
	return result{rate: float64(len(all)) / d.Seconds(), p50: all[len(all)/2]}
}

func median(rs []result) result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b result) int {
		switch {
		case a.rate < b.rate:
			return -1
		case a.rate > b.rate:
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
