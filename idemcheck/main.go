package idemcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Exit codes of Main.
const (
	ExitPass   = 0 // no check failed and one passed (warnings allowed), or the load had no failure
	ExitFail   = 1 // a check failed, or a load request failed
	ExitUsage  = 2 // bad flags, or the target could not be reached
	usageShort = "usage: idem check [flags] URL (idem check -h for help)"
)

const usageLong = `usage: idem check [flags] URL

Checks that URL honours Idempotency-Key: fires -n identical requests with one
fresh key at the same instant, retries after they finish, reuses the key
with another body, sends a fresh key, and (with --count-url) counts the
resources created. Each check prints one line: PASS, WARN, FAIL or SKIP with
its evidence. Exit status: 0 when no check failed and at least one passed,
1 when one failed or nothing could be proven, 2 for bad flags or an
unreachable URL.

With --load, sends requests from --concurrency workers for --duration
instead, and reports throughput, latency percentiles and a histogram.

The checks create real resources: point them at a test environment.

Example:
  idem check -d '{"cart_id":"c_42","total_cents":1900}' \
    --count-url 'http://127.0.0.1:3000/orders?cart_id=c_42' \
    http://127.0.0.1:3000/orders

Flags:
`

// headerFlag collects repeated -H "Name: value" flags.
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("want \"Name: value\", got %q", v)
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

// Main runs `idem check` with args (the arguments after "check"), writing
// the report to stdout and errors and progress to stderr, and returns the
// exit code: ExitPass, ExitFail or ExitUsage. Flags may come before or
// after the URL.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("idem check", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported on one line below
	method := fs.String("X", http.MethodPost, "request `method`")
	data := fs.String("d", "", "request `body`; @FILE reads it from FILE")
	var headers headerFlag
	fs.Var(&headers, "H", "request `header` \"Name: value\" (repeatable)")
	n := fs.Int("n", DefaultConcurrency, "identical requests fired at once by check 1")
	countURL := fs.String("count-url", "", "GET `URL` answering a JSON array of the resources, to count them (check 5)")
	asJSON := fs.Bool("json", false, "print a machine-readable JSON report")
	timeout := fs.Duration("timeout", DefaultTimeout, "bound on each request")
	keyHeader := fs.String("key-header", DefaultKeyHeader, "`name` of the idempotency key header")
	load := fs.Bool("load", false, "load mode: measure throughput and latency instead of checking")
	duration := fs.Duration("duration", DefaultLoadDuration, "load mode: how long to send requests")
	concurrency := fs.Int("concurrency", DefaultLoadConcurrency, "load mode: number of workers")
	replay := fs.Bool("replay", false, "load mode: one key per worker, so requests after its first are replays")

	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "idem check: "+format+"\n", a...)
		return ExitUsage
	}
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, usageLong)
				fs.SetOutput(stdout)
				fs.PrintDefaults()
				return ExitPass
			}
			return fail("%v; %s", err, usageShort)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if len(positional) != 1 {
		if len(positional) == 0 {
			return fail("missing URL; %s", usageShort)
		}
		return fail("want one URL, got %d arguments (%s); %s", len(positional), strings.Join(positional, " "), usageShort)
	}
	body := []byte(*data)
	if strings.HasPrefix(*data, "@") {
		b, err := os.ReadFile((*data)[1:])
		if err != nil {
			return fail("-d: %v", err)
		}
		body = b
	}
	header := headers.h
	if header == nil {
		header = http.Header{}
	}
	if len(body) > 0 && header.Get("Content-Type") == "" {
		// As curl does for -d, but JSON gets its own type: a JSON API
		// may refuse a form content type.
		ct := "application/x-www-form-urlencoded"
		if t := bytes.TrimSpace(body); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
			ct = "application/json"
		}
		header.Set("Content-Type", ct)
	}

	if *load {
		return runLoad(ctx, LoadConfig{
			URL: positional[0], Method: *method, Body: body, Header: header, KeyHeader: *keyHeader,
			Duration: *duration, Concurrency: *concurrency, Replay: *replay, Timeout: *timeout,
		}, *asJSON, stdout, stderr)
	}
	rep, err := Check(ctx, Config{
		URL: positional[0], Method: *method, Body: body, Header: header, KeyHeader: *keyHeader,
		Concurrency: *n, CountURL: *countURL, Timeout: *timeout,
	})
	if err != nil {
		return fail("%v", err)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		_ = enc.Encode(rep)
	} else {
		WriteReport(stdout, rep)
	}
	if !rep.Passed {
		return ExitFail
	}
	return ExitPass
}

// WriteReport writes rep as text: a heading, one line per check with its
// evidence (further evidence indented below it), and a verdict.
func WriteReport(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "idem check %s %s (%d requests at once)\n", rep.Method, rep.URL, rep.Concurrency)
	tally := map[Status]int{}
	for _, r := range rep.Results {
		tally[r.Status]++
		fmt.Fprintf(w, "%-4s  %d. %-22s  %s\n", strings.ToUpper(string(r.Status)), r.ID, r.Name, r.Evidence)
		for _, d := range r.Details {
			fmt.Fprintf(w, "         %s\n", d)
		}
	}
	verdict := "PASS"
	if !rep.Passed {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s: %d passed, %d warnings, %d failed, %d skipped",
		verdict, tally[Pass], tally[Warn], tally[Fail], tally[Skip])
	if !rep.Passed && tally[Fail] == 0 {
		fmt.Fprint(w, "; nothing proven: give a body to vary (-d) or a list to count (--count-url)")
	}
	fmt.Fprintln(w)
}

func runLoad(ctx context.Context, config LoadConfig, asJSON bool, stdout, stderr io.Writer) int {
	var clear func()
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		var mu sync.Mutex
		config.ProgressFunc = func(p LoadProgress) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Fprint(stderr, "\r\033[2K"+progressLine(p))
		}
		clear = func() { fmt.Fprint(stderr, "\r\033[2K") }
	}
	rep, err := Load(ctx, config)
	if clear != nil {
		clear()
	}
	if err != nil {
		fmt.Fprintf(stderr, "idem check: %v\n", err)
		return ExitUsage
	}
	if asJSON {
		b, _ := json.MarshalIndent(rep, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		WriteLoadReport(stdout, rep)
	}
	if rep.Failures > 0 {
		return ExitFail
	}
	return ExitPass
}

// progressLine renders a progress bar for a running load.
func progressLine(p LoadProgress) string {
	const width = 30
	frac := 1.0
	if p.Duration > 0 {
		frac = min(float64(p.Elapsed)/float64(p.Duration), 1)
	}
	done := int(frac * width)
	rate := 0.0
	if p.Elapsed > 0 {
		rate = float64(p.Requests) / p.Elapsed.Seconds()
	}
	return fmt.Sprintf("[%s%s] %5.1fs/%s  %d requests  %.0f/s  %d failures",
		strings.Repeat("#", done), strings.Repeat(".", width-done),
		p.Elapsed.Seconds(), p.Duration, p.Requests, rate, p.Failures)
}

// WriteLoadReport writes rep as text: totals, statuses, latency
// percentiles and a histogram with one bar per bucket.
func WriteLoadReport(w io.Writer, rep *LoadReport) {
	mode := "a fresh key per request"
	if rep.Replay {
		mode = "one key per worker (replays)"
	}
	fmt.Fprintf(w, "idem check --load %s %s: %d workers, %s\n", rep.Method, rep.URL, rep.Concurrency, mode)
	if rep.Interrupted {
		fmt.Fprintln(w, "interrupted: partial results")
	}
	fmt.Fprintf(w, "requests    %d in %.2fs: %.1f/s, %d failures, %d replays\n",
		rep.Requests, rep.Elapsed.Seconds(), rep.Throughput, rep.Failures, rep.Replays)
	codes := make([]int, 0, len(rep.Statuses))
	for c := range rep.Statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d×%d", rep.Statuses[c], c))
	}
	errs := make([]string, 0, len(rep.Errors))
	for e, n := range rep.Errors {
		errs = append(errs, fmt.Sprintf("%d× %s", n, e))
	}
	sort.Strings(errs)
	fmt.Fprintf(w, "statuses    %s\n", strings.Join(parts, ", "))
	for _, e := range errs {
		fmt.Fprintf(w, "error       %s\n", e)
	}
	if len(rep.Histogram) == 0 {
		return
	}
	l := rep.Latency
	fmt.Fprintf(w, "latency     min %v  mean %v  p50 %v  p90 %v  p99 %v  max %v\n",
		round(l.Min), round(l.Mean), round(l.P50), round(l.P90), round(l.P99), round(l.Max))
	fmt.Fprintln(w, "histogram")
	most, total := 0, 0
	for _, b := range rep.Histogram {
		most = max(most, b.Count)
		total += b.Count
	}
	const width = 40
	for _, b := range rep.Histogram {
		bar := b.Count * width / most
		fmt.Fprintf(w, "  ≤ %8v |%-*s| %7d %5.1f%%\n", b.UpTo, width, strings.Repeat("█", bar), b.Count, 100*float64(b.Count)/float64(total))
	}
}

// round keeps three significant-ish digits of a latency for reading.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}
