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
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"
)

// Exit codes of Main.
const (
	ExitPass   = 0 // no check failed and one execution per key was counted, or the load had no failure
	ExitFail   = 1 // a check failed, one execution per key was not proven, or a load request failed
	ExitUsage  = 2 // bad flags, or the target could not be reached
	usageShort = "usage: idem check [flags] URL (idem check --help for help)"
)

const usageLong = `usage: idem check [flags] URL

Checks that URL honours Idempotency-Key. Each check prints one line, PASS,
WARN, FAIL or SKIP, with its evidence:
  1. fires -n identical requests with one fresh key at the same instant;
  2. retries once they have all answered;
  3. reuses the key with another body;
  4. sends a fresh key;
  5. counts the resources created for each key (--count-url);
  6. cuts a request's connection while the server works on it, retries
     with its key until answered, and counts again (--count-url); when
     the retry's answer is not a replay, the cut execution may still
     commit, so the count is taken again until it stays the same for
     --settle.

Answers alone cannot show that duplicates ran once: a server may run each
one and answer them all with the first answer. Only a count can, through
--count-url, a GET listing the resources. Without it checks 1, 5 and 6 are
not proven, the report says so, and the run does not pass.

Exit status: 0 when no check failed and one execution per key was counted,
1 when a check failed or that was not proven, 2 for bad flags or an
unreachable URL.

With --load, sends requests from --concurrency workers for --duration
instead, and reports throughput, latency percentiles and a histogram.

The checks create real resources (three per run on a correct endpoint):
point them at a test environment. Of each answer at most 64 KiB of header
and 4 MiB of body are read (the first 64 KiB kept, to show and compare, the
rest hashed); the --count-url list is read as a stream, up to 16 MiB. Every
byte a server sent is escaped before it is printed.

Credentials are never printed: a URL's password (or a user name alone) and
query parameters such as access_token or api_key are shown as xxxxx, -H
values are never shown, and the values of those and of credential headers
(Authorization, Cookie, X-Api-Key, ...) are hidden wherever they appear,
answers that echo them included. Write / ? # @ % space and " percent-
encoded in a URL's user name or password.

Example:
  idem check -d '{"cart_id":"c_42","total_cents":1900}' \
    --count-url 'http://127.0.0.1:3000/orders?cart_id=c_42' \
    http://127.0.0.1:3000/orders

`

// headerFlag collects repeated -H "Name: value" flags. A malformed one is
// reported after parsing, by headerFlag itself: the flag package's own
// error would quote the whole value, and a header's value is often a
// credential (-H 'Authorization Bearer …' with its colon forgotten).
type headerFlag struct {
	h   http.Header
	n   int   // -H flags seen
	err error // the first malformed one
}

func (f *headerFlag) String() string { return "" }

func (f *headerFlag) Set(v string) error {
	f.n++
	name, value, ok := strings.Cut(v, ":")
	name = strings.TrimSpace(name)
	if !ok || !headerName(name) {
		if f.err == nil {
			f.err = malformedHeader(f.n, v)
		}
		return nil
	}
	if f.h == nil {
		f.h = http.Header{}
	}
	f.h.Add(name, strings.TrimSpace(value))
	return nil
}

// malformedHeader describes the n-th -H flag, v, which is not "Name:
// value", without its value: by its first word when that is a well-known
// header name followed by more (-H 'Authorization Bearer …'), else by its
// position (the first word of -H 's3cr3t t0ken' is a piece of a
// credential).
func malformedHeader(n int, v string) error {
	which := fmt.Sprintf("-H flag %d", n)
	if f := strings.Fields(v); len(f) > 1 && wellKnownHeaders[http.CanonicalHeaderKey(f[0])] {
		which = fmt.Sprintf("-H %q", http.CanonicalHeaderKey(f[0])+" …")
	}
	return fmt.Errorf("%s: want \"Name: value\", a header name then a colon (the value is not shown: it may hold a credential)", which)
}

// wellKnownHeaders are names a malformed -H may be told by.
var wellKnownHeaders = map[string]bool{
	"Authorization": true, "Proxy-Authorization": true, "Cookie": true, "X-Api-Key": true, "Api-Key": true,
	"X-Auth-Token": true, "X-Access-Token": true, "X-Csrf-Token": true, "X-Xsrf-Token": true,
	"Content-Type": true, "Accept": true, "Accept-Language": true, "User-Agent": true, "Host": true,
	"Origin": true, "Referer": true, "If-Match": true, "If-None-Match": true, "X-Tenant-Id": true,
	"X-Request-Id": true, "X-Forwarded-For": true, "Idempotency-Key": true, "X-Idempotency-Key": true,
}

// headerName reports whether s is a header field name: one or more token
// characters (RFC 9110 §5.6.2).
func headerName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r >= 0x80 || !(r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || strings.ContainsRune("!#$%&'*+-.^_`|~", r)) {
			return false
		}
	}
	return true
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
	countURL := fs.String("count-url", "", "GET `URL` answering a JSON array of the resources (or an X-Total-Count), to count them (checks 1, 5, 6)")
	asJSON := fs.Bool("json", false, "print a machine-readable JSON report")
	timeout := fs.Duration("timeout", DefaultTimeout, "bound on each request")
	keyHeader := fs.String("key-header", DefaultKeyHeader, "`name` of the idempotency key header")
	load := fs.Bool("load", false, "load mode: measure throughput and latency instead of checking")
	duration := fs.Duration("duration", DefaultLoadDuration, "load mode: how long to send requests")
	concurrency := fs.Int("concurrency", DefaultLoadConcurrency, "load mode: number of workers")
	replay := fs.Bool("replay", false, "load mode: one key per worker, so requests after its first are replays")
	disconnectAfter := fs.Duration("disconnect-after", 0, "check 6: cut the first request's connection this long after sending it (0: at once);\nabout half the handler's time cuts it midway")
	inFlightWait := fs.Duration("in-flight-wait", DefaultInFlightWait, "check 6: how long to keep retrying while answered 409")
	settle := fs.Duration("settle", DefaultSettle, "check 6: when the retry's answer is not a replay, how long the count must stay the same\nbefore it is final (the cut execution may still commit)")

	fail := func(format string, a ...any) int {
		fmt.Fprintln(stderr, "idem check: "+safeText(fmt.Sprintf(format, a...)))
		return ExitUsage
	}
	var positional []string
	for rest := args; ; {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, usageLong)
				printFlags(stdout, fs)
				return ExitPass
			}
			return fail("%s; %s", longDashes(flagError(err, fs)), usageShort)
		}
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if headers.err != nil {
		return fail("%v; %s", headers.err, usageShort)
	}
	if len(positional) != 1 {
		if len(positional) == 0 {
			return fail("missing URL; %s", usageShort)
		}
		// The arguments are not shown: a flag's value split by the shell
		// at a space (-H Authorization: Bearer …) leaves the credential
		// among them.
		return fail("want one URL, got %d arguments (not shown: one may be a credential, split from a flag's value at a space: quote such values); %s", len(positional), usageShort)
	}
	if *settle <= 0 {
		return fail("--settle must be positive, got %v; %s", *settle, usageShort)
	}
	// The flags by the names the user typed: the Config's own checks name
	// its fields, and take a zero for "the default".
	switch {
	case *n < 2:
		return fail("-n must be at least 2 (identical requests at once), got %d; %s", *n, usageShort)
	case *concurrency < 1:
		return fail("--concurrency must be at least 1, got %d; %s", *concurrency, usageShort)
	case *timeout <= 0:
		return fail("--timeout must be positive, got %v; %s", *timeout, usageShort)
	case *duration <= 0:
		return fail("--duration must be positive, got %v; %s", *duration, usageShort)
	case *disconnectAfter < 0:
		return fail("--disconnect-after must not be negative, got %v; %s", *disconnectAfter, usageShort)
	case *inFlightWait <= 0:
		return fail("--in-flight-wait must be positive, got %v; %s", *inFlightWait, usageShort)
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
		DisconnectAfter: *disconnectAfter, InFlightWait: *inFlightWait, Settle: *settle,
	})
	if err != nil {
		return fail("%v", err)
	}
	if *countURL == "" {
		fmt.Fprintln(stderr, "idem check: warning: no --count-url, so nothing counts what the requests created: "+
			"that duplicates ran once (checks 1, 5, 6) is not proven, and the run cannot pass")
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
// evidence (further evidence indented below it), a verdict, and, unless
// everything was proven, what was and what was not. Everything is
// escaped as it is printed, so that a report decoded from elsewhere is
// safe too.
func WriteReport(w io.Writer, rep *Report) {
	fmt.Fprintf(w, "idem check %s %s (%d requests at once)\n", safeText(rep.Method), safeText(rep.URL), rep.Concurrency)
	tally := map[Status]int{}
	for _, r := range rep.Results {
		tally[r.Status]++
		fmt.Fprintf(w, "%-4s  %d. %-22s  %s\n", strings.ToUpper(safeText(string(r.Status))), r.ID, safeText(r.Name), safeText(r.Evidence))
		for _, d := range r.Details {
			fmt.Fprintf(w, "         %s\n", safeText(d))
		}
	}
	verdict := "PASS"
	switch {
	case tally[Fail] > 0:
		verdict = "FAIL"
	case !rep.Passed:
		verdict = "NOT PROVEN"
	}
	warnings := "warnings"
	if tally[Warn] == 1 {
		warnings = "warning"
	}
	fmt.Fprintf(w, "%s: %d passed, %d %s, %d failed, %d skipped\n",
		verdict, tally[Pass], tally[Warn], warnings, tally[Fail], tally[Skip])
	if len(rep.NotProven) == 0 && rep.Passed {
		return
	}
	fmt.Fprintln(w, "proven:")
	if len(rep.Proven) == 0 {
		fmt.Fprintln(w, "  nothing")
	}
	for _, p := range rep.Proven {
		fmt.Fprintf(w, "  %s\n", safeText(p))
	}
	if len(rep.NotProven) > 0 {
		fmt.Fprintln(w, "not proven:")
		for _, p := range rep.NotProven {
			fmt.Fprintf(w, "  %s\n", safeText(p))
		}
	}
}

// printFlags lists the flags as the other idem commands do: --name for a
// long flag, -X for a one-letter one (as curl spells them); the flag
// package accepts either number of dashes.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, "Flags:")
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flag.UnquoteUsage(f)
		head := "  " + dashes(f.Name) + f.Name
		if typ != "" {
			head += " " + typ
		}
		line := head + "\n      " + strings.ReplaceAll(usage, "\n", "\n      ")
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" && f.DefValue != "0s" {
			line += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintln(w, line)
	})
}

func dashes(name string) string {
	if len(name) == 1 {
		return "-"
	}
	return "--"
}

// flagError is the text of one of the flag package's errors, without the
// name of an unknown flag unless it reads as a flag name (lower-case
// words): a credential that begins with a dash, split by the shell from a
// flag's value at a space, is taken for a flag. The nearest known flag is
// suggested instead.
func flagError(err error, fs *flag.FlagSet) string {
	msg := err.Error()
	name, ok := strings.CutPrefix(msg, "flag provided but not defined: -")
	if !ok {
		return msg
	}
	name = strings.TrimPrefix(name, "-")
	near := ""
	fs.VisitAll(func(f *flag.Flag) {
		if len(f.Name) > 1 && editDistance(f.Name, name) <= max(2, len(f.Name)/4) {
			near = f.Name
		}
	})
	plain := len(name) <= 20
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r == '-') {
			plain = false
		}
	}
	switch {
	case plain && near != "":
		return fmt.Sprintf("%s (did you mean -%s?)", msg, near)
	case plain:
		return msg
	case near != "":
		return fmt.Sprintf("an unknown flag (not shown: it may be a credential split from a flag's value at a space; did you mean -%s?)", near)
	}
	return "an unknown flag (not shown: it may be a credential, split from a flag's value at a space: quote such values)"
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// flagName is a flag named in one of the flag package's errors, with the
// one dash it writes.
var flagName = regexp.MustCompile(`(^|[ :])-([A-Za-z][A-Za-z-]+)\b`)

// longDashes writes the long flags an error names with two dashes, as the
// help lists them.
func longDashes(msg string) string {
	return flagName.ReplaceAllString(msg, "${1}--${2}")
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
		fmt.Fprintln(stderr, "idem check: "+safeText(err.Error()))
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
	fmt.Fprintf(w, "idem check --load %s %s: %d workers, %s\n", safeText(rep.Method), safeText(rep.URL), rep.Concurrency, mode)
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
		errs = append(errs, fmt.Sprintf("%d× %s", n, safeText(e)))
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
