// Command proxybench measures the overhead of `idem proxy`: the same
// load sent straight to an upstream that answers in -upstream-delay (5 ms
// by default), and through the proxy in front of it, with fresh keys and
// with replays, in one run, on SQLite and on Redis keys. Phases
// alternate for -rounds rounds, so that the machine's noise falls on
// every side alike, and the median round's throughput of each is
// reported with its ratio to direct.
//
//	go run ./proxybench -duration 3s -concurrency 32 -rounds 3
//
// The proxy is what a user runs: the idem binary, built from this
// checkout (or -idem PATH), started as `idem proxy` with its defaults in
// a process of its own (--tenant shared, --db sqlite: on a fresh file or
// --keys on -redis). The upstream counts the TCP connections it accepts
// in each phase: the proxy should reuse its few, as the direct clients
// do theirs, rather than open one per request.
//
// Keep in mind that the proxy, the upstream and the load generator share
// the machine's cores: on a small machine the ratios measure the proxy's
// CPU cost as much as its latency.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	duration := flag.Duration("duration", 3*time.Second, "length of each phase")
	concurrency := flag.Int("concurrency", 32, "concurrent clients")
	delay := flag.Duration("upstream-delay", 5*time.Millisecond, "how long the upstream takes to answer")
	rounds := flag.Int("rounds", 3, "rounds of alternating phases; the median is reported")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis for the Redis keys")
	stores := flag.String("stores", "sqlite,redis", "stores to measure")
	idemBin := flag.String("idem", "", "the idem binary to run (default: build github.com/idem-go/idem/cmd/idem)")
	flag.Parse()
	log.SetFlags(0)

	dir, err := os.MkdirTemp("", "proxybench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := *idemBin
	if bin == "" {
		bin = filepath.Join(dir, "idem")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/idem-go/idem/cmd/idem").CombinedOutput(); err != nil {
			log.Fatalf("go build cmd/idem: %v\n%s", err, out)
		}
	}

	upstream := startUpstream(*delay)
	fmt.Printf("upstream answering in %s; %d clients; %s per phase; %d rounds; GOMAXPROCS %d; load average before: %s\n",
		*delay, *concurrency, *duration, *rounds, runtime.GOMAXPROCS(0), loadAverage())
	fmt.Printf("%-7s %-14s %10s %8s %10s %15s %14s\n", "store", "phase", "req/s", "ratio", "p50", "upstream conns", "proxy CPU/req")
	for _, name := range strings.Split(*stores, ",") {
		args, err := storeArgs(name, *redisURL, dir)
		if err != nil {
			log.Fatalf("%s: %v", name, err)
		}
		proxy, pid, stop := startProxy(bin, upstream.url, args)
		results := map[string][]result{}
		conns := map[string]int64{}
		cpu := map[string]time.Duration{}
		requests := map[string]int{}
		cpuKnown := true
		phase := func(label, base string, replay bool, tag string) {
			before := upstream.accepted.Load()
			cpuBefore, ok1 := cpuTime(pid)
			r := run(base, *concurrency, *duration, replay, tag)
			cpuAfter, ok2 := cpuTime(pid)
			results[label] = append(results[label], r)
			conns[label] += upstream.accepted.Load() - before
			cpu[label] += cpuAfter - cpuBefore
			cpuKnown = cpuKnown && ok1 && ok2
			requests[label] += r.n
		}
		for round := range *rounds {
			// The round is in the fresh keys' tag: a key of an earlier
			// round would be a replay.
			phase("direct", upstream.url, false, "direct")
			phase("proxy fresh", proxy, false, fmt.Sprintf("%s-fresh-%d", name, round))
			phase("proxy replays", proxy, true, name+"-replay")
		}
		stop()
		base := median(results["direct"]).rate
		for _, label := range []string{"direct", "proxy fresh", "proxy replays"} {
			m := median(results[label])
			perReq := "-"
			if label != "direct" && requests[label] > 0 && cpuKnown {
				perReq = (cpu[label] / time.Duration(requests[label])).Round(time.Microsecond).String()
			}
			fmt.Printf("%-7s %-14s %10.0f %7.2fx %10s %15d %14s\n", name, label, m.rate, m.rate/base, m.p50.Round(10*time.Microsecond), conns[label], perReq)
		}
	}
	fmt.Printf("upstream conns: TCP connections the upstream accepted during the phase, all rounds together\n")
	fmt.Printf("proxy CPU/req: the idem proxy process's CPU time (user and system) per request, all rounds together\n")
	fmt.Printf("load average after: %s\n", loadAverage())
}

// upstream is the service behind the proxy.
type upstream struct {
	url string
	// accepted counts the TCP connections it accepted.
	accepted *atomic.Int64
}

// startUpstream serves the upstream: 201 and a small JSON body after
// delay, as a service whose work takes that long.
func startUpstream(delay time.Duration) upstream {
	var n atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	u := upstream{url: "http://" + ln.Addr().String(), accepted: &atomic.Int64{}}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body) //nolint:errcheck // read whole
			time.Sleep(delay)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"id":%d,"status":"created"}`, n.Add(1))
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				u.accepted.Add(1)
			}
		},
	}
	go srv.Serve(ln) //nolint:errcheck // runs until exit
	return u
}

// storeArgs are the flags of `idem proxy` for the store name.
func storeArgs(name, redisURL, dir string) ([]string, error) {
	switch name {
	case "sqlite":
		return []string{"--db", "sqlite:" + filepath.Join(dir, "idem.db")}, nil
	case "redis":
		// Reached once here, so that a Redis that is down is said so.
		opts, err := redis.ParseURL(redisURL)
		if err != nil {
			return nil, err
		}
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			return nil, err
		}
		return []string{"--keys", redisURL}, nil
	}
	return nil, fmt.Errorf("unknown store %q", name)
}

var listening = regexp.MustCompile(`msg="proxy listening" addr=(\S+)`)

// startProxy runs `idem proxy` in front of upstream until stop, and
// returns its URL and process id. Its warnings and errors are copied to
// stderr.
func startProxy(bin, upstream string, storeArgs []string) (url string, pid int, stop func()) {
	args := append([]string{"proxy", "--upstream", upstream, "--addr", "127.0.0.1:0", "--tenant", "shared"}, storeArgs...)
	cmd := exec.Command(bin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		log.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			if m := listening.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			} else if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
				fmt.Fprintln(os.Stderr, "idem proxy:", line)
			}
		}
	}()
	select {
	case a := <-addr:
		url = "http://" + a
	case <-done:
		log.Fatalf("idem proxy %s ended before listening: %v", strings.Join(args, " "), cmd.Wait())
	case <-time.After(30 * time.Second):
		cmd.Process.Kill() //nolint:errcheck // giving up
		log.Fatal("idem proxy not listening after 30s")
	}
	return url, cmd.Process.Pid, func() {
		cmd.Process.Signal(os.Interrupt) //nolint:errcheck // Wait reports it
		<-done
		if err := cmd.Wait(); err != nil {
			log.Fatalf("idem proxy: %v", err)
		}
	}
}

type result struct {
	rate float64
	p50  time.Duration
	n    int // requests answered
}

// clockTick is the unit of /proc/PID/stat's times, USER_HZ: 100 on
// every Linux architecture Go runs on.
const clockTick = 10 * time.Millisecond

// cpuTime is the CPU time process pid used so far (user and system);
// false where /proc cannot tell (then no figure is printed).
func cpuTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The fields after the command, which is in parentheses and may hold
	// spaces: state is the 3rd field, utime the 14th, stime the 15th.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	user, err1 := strconv.ParseInt(f[11], 10, 64)
	sys, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(user+sys) * clockTick, true
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
	return result{rate: float64(len(all)) / d.Seconds(), p50: all[len(all)/2], n: len(all)}
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
