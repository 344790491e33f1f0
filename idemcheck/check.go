package idemcheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Header names of the contract (idemhttp.HeaderKey, idemhttp.HeaderReplayed),
// repeated so that checking an endpoint does not need the server package.
const (
	DefaultKeyHeader = "Idempotency-Key"
	headerReplayed   = "Idempotent-Replayed"
)

// Defaults for Config and LoadConfig.
const (
	DefaultConcurrency     = 20
	DefaultTimeout         = 10 * time.Second
	DefaultLoadConcurrency = 16
	DefaultLoadDuration    = 10 * time.Second
)

// maxDetails bounds the evidence lines of one check.
const maxDetails = 8

// maxBody bounds what is read of an answer to compare it.
const maxBody = 4 << 20

// ErrUnreachable is wrapped by the error Check returns when the target
// answered none of the requests (connection refused, DNS failure, every
// request timed out).
var ErrUnreachable = errors.New("cannot reach")

// Config says what to check. URL is required; every zero field means its
// documented default.
type Config struct {
	// URL is the endpoint under test, http or https.
	URL string

	// Method defaults to POST.
	Method string

	// Body is sent with every request. Check 3 derives another body from
	// it (see Check).
	Body []byte

	// Header is added to every request, the count requests included (so
	// an Authorization header scopes both alike).
	Header http.Header

	// KeyHeader is the name of the idempotency key header. Defaults to
	// Idempotency-Key; some APIs use X-Idempotency-Key.
	KeyHeader string

	// Concurrency is how many identical requests check 1 releases at once.
	// Defaults to 20; at least 2.
	Concurrency int

	// CountURL, when set, is fetched with GET before and after the
	// requests; its answer, a JSON array (or an object with a "data"
	// array), counts the resources. Enables check 5.
	CountURL string

	// Timeout bounds each request. Defaults to 10s.
	Timeout time.Duration

	// Client sends the requests. Defaults to a client with Timeout, a
	// connection pool sized for Concurrency, and redirects not followed
	// (a 303 is an answer to compare, not a hop to take).
	Client *http.Client

	// KeyFunc makes the keys. Defaults to random UUIDv4s.
	KeyFunc func() string
}

// Status is the verdict of one check.
type Status string

// The verdicts. Warn and Skip do not fail a run.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Result is the outcome of one check.
type Result struct {
	// ID is the check's number, 1 to 5, as in the package documentation.
	ID int `json:"id"`
	// Name names the check.
	Name string `json:"name"`
	// Status is the verdict.
	Status Status `json:"status"`
	// Evidence says in one line what was seen: statuses counted, bodies
	// compared, resources counted.
	Evidence string `json:"evidence"`
	// Details are further lines of evidence: the differing answers, the
	// first differing byte.
	Details []string `json:"details,omitempty"`
	// Statuses counts the answers by status code; "error" counts requests
	// that got no answer.
	Statuses map[string]int `json:"statuses,omitempty"`
}

// Report is the outcome of Check.
type Report struct {
	URL         string   `json:"url"`
	Method      string   `json:"method"`
	Concurrency int      `json:"concurrency"`
	Keys        []string `json:"keys"` // the keys used: check 1–3's, then check 4's
	Results     []Result `json:"checks"`
	// Passed is true when no check failed and at least one passed.
	Passed bool `json:"passed"`
}

// Check runs the five checks against config.URL, in order. It returns an
// error, and no report, when the configuration is unusable or the target
// cannot be reached (wrapping ErrUnreachable); a target that answers
// wrongly gives a report with failed checks, not an error.
func Check(ctx context.Context, config Config) (*Report, error) {
	c, err := newChecker(config)
	if err != nil {
		return nil, err
	}
	defer c.closeIdle()
	return c.run(ctx)
}

type checker struct {
	Config
	// ownClient is true when the checker made Client itself, and must
	// close its idle connections when done: a program calling Check in a
	// loop would otherwise keep 2×Concurrency connections per call.
	ownClient bool
}

func (c *checker) closeIdle() {
	if c.ownClient {
		c.Client.CloseIdleConnections()
	}
}

func newChecker(config Config) (*checker, error) {
	c := &checker{Config: config}
	if err := validURL(c.URL); err != nil {
		return nil, err
	}
	if c.CountURL != "" {
		if err := validURL(c.CountURL); err != nil {
			return nil, fmt.Errorf("count URL: %w", err)
		}
	}
	if c.Method == "" {
		c.Method = http.MethodPost
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if c.Header.Get(c.KeyHeader) != "" {
		return nil, fmt.Errorf("do not set %s: the check makes its own keys", c.KeyHeader)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 2 {
		return nil, fmt.Errorf("concurrency must be at least 2, got %d", c.Concurrency)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Client == nil {
		c.Client = newHTTPClient(c.Timeout, c.Concurrency)
		c.ownClient = true
	}
	if c.KeyFunc == nil {
		c.KeyFunc = uuid.NewString
	}
	return c, nil
}

func validURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("bad URL %q: %v", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bad URL %q: want http://host/path or https://host/path", raw)
	}
	return nil
}

func newHTTPClient(timeout time.Duration, conns int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = conns * 2
	tr.MaxIdleConnsPerHost = conns * 2
	return &http.Client{
		Transport:     tr,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// answer is what one request got back.
type answer struct {
	status int
	header http.Header
	body   []byte
	err    error
}

func (a *answer) success() bool { return a.err == nil && a.status >= 200 && a.status < 400 }
func (a *answer) replayed() bool {
	return a.err == nil && strings.EqualFold(strings.TrimSpace(a.header.Get(headerReplayed)), "true")
}

func (a *answer) statusText() string {
	if a.err != nil {
		return "error"
	}
	return strconv.Itoa(a.status)
}

func (a *answer) describe() string {
	if a.err != nil {
		return "error: " + errText(a.err)
	}
	s := strconv.Itoa(a.status)
	if loc := a.header.Get("Location"); loc != "" {
		s += " Location " + loc
	}
	return s + " body " + clip(a.body)
}

func (c *checker) send(ctx context.Context, key string, body []byte) answer {
	req, err := http.NewRequestWithContext(ctx, c.Method, c.URL, bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	for name, values := range c.Header {
		req.Header[name] = values
	}
	if host := c.Header.Get("Host"); host != "" {
		req.Host = host // net/http sends req.Host, never a Host field of Header
	}
	if key != "" {
		req.Header.Set(c.KeyHeader, key)
	}
	return c.do(req)
}

func (c *checker) do(req *http.Request) answer {
	resp, err := c.Client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return answer{err: fmt.Errorf("reading the answer: %w", err)}
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: body}
}

// count fetches CountURL and counts the resources it lists.
func (c *checker) count(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.CountURL, nil)
	if err != nil {
		return 0, err
	}
	for name, values := range c.Header {
		if name != "Content-Type" {
			req.Header[name] = values
		}
	}
	a := c.do(req)
	if a.err != nil {
		return 0, a.err
	}
	if a.status != http.StatusOK {
		return 0, fmt.Errorf("GET %s answered %d", c.CountURL, a.status)
	}
	// A list may be cut to a page; X-Total-Count, where the API sends it,
	// counts them all.
	if total := a.header.Get("X-Total-Count"); total != "" {
		n, err := strconv.Atoi(strings.TrimSpace(total))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("GET %s: X-Total-Count %q is not a count", c.CountURL, total)
		}
		return n, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(a.body, &list); err != nil {
		var obj struct {
			Data []json.RawMessage `json:"data"`
		}
		if err2 := json.Unmarshal(a.body, &obj); err2 != nil || obj.Data == nil {
			return 0, fmt.Errorf("GET %s: want a JSON array (or an object with a \"data\" array): %v", c.CountURL, err)
		}
		list = obj.Data
	}
	return len(list), nil
}

func (c *checker) run(ctx context.Context) (*Report, error) {
	key1, key2 := c.KeyFunc(), c.KeyFunc()
	rep := &Report{URL: c.URL, Method: c.Method, Concurrency: c.Concurrency, Keys: []string{key1, key2}}

	var counts []int // before, after key 1, after key 2
	var countErr error
	countNow := func() {
		if c.CountURL == "" || countErr != nil {
			return
		}
		n, err := c.count(ctx)
		if err != nil {
			countErr = err
			return
		}
		counts = append(counts, n)
	}
	countNow()
	if countErr != nil {
		if errors.As(countErr, new(*url.Error)) {
			return nil, fmt.Errorf("%w %s: %s", ErrUnreachable, c.CountURL, errText(countErr))
		}
		return nil, countErr
	}

	answers := c.fireTogether(ctx, key1)
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if err := allFailed(answers); err != nil {
		return nil, fmt.Errorf("%w %s: %s", ErrUnreachable, c.URL, errText(err))
	}
	r1, original := judgeConcurrent(answers)
	retry := c.send(ctx, key1, c.Body)
	if unmarked := countUnmarked(answers); unmarked > 1 && retry.success() && retry.replayed() {
		// The server marks its replays (the retry was), so several
		// unmarked successes are several executions, identical or not.
		r1.Status = Fail
		r1.Evidence = fmt.Sprintf("%d requests at once: %s; %d successful answers not marked %s, from a server that marks its replays (check 2): the operation ran %d times",
			len(answers), tallyStatuses(r1.Statuses), unmarked, headerReplayed, unmarked)
	}
	rep.Results = append(rep.Results, r1)

	rep.Results = append(rep.Results, judgeRetry(original, retry))

	if other, ok := otherBody(c.Body, c.Header.Get("Content-Type")); ok {
		rep.Results = append(rep.Results, judgeOtherBody(c.send(ctx, key1, other)))
	} else {
		rep.Results = append(rep.Results, Result{ID: 3, Name: nameOtherBody, Status: Skip,
			Evidence: "no body to vary (-d): nothing to compare a fingerprint against"})
	}
	countNow()

	rep.Results = append(rep.Results, judgeFreshKey(original, c.send(ctx, key2, c.Body)))
	countNow()

	rep.Results = append(rep.Results, judgeCounts(c.CountURL, counts, countErr))
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}

	// Passed: nothing failed, and something was proven. Warnings alone
	// (answers that cannot be told apart, nothing to vary, nothing to
	// count) prove nothing about the endpoint.
	proven := false
	rep.Passed = true
	for _, r := range rep.Results {
		switch r.Status {
		case Fail:
			rep.Passed = false
		case Pass:
			proven = true
		}
	}
	rep.Passed = rep.Passed && proven
	return rep, nil
}

// countUnmarked counts the successful answers not marked as replays.
func countUnmarked(answers []answer) int {
	n := 0
	for i := range answers {
		if answers[i].success() && !answers[i].replayed() {
			n++
		}
	}
	return n
}

// fireTogether sends Concurrency identical requests with key, each from
// its own goroutine, released together by one barrier: requests sent one
// after the other would let the first finish before the next looks, and
// prove nothing.
func (c *checker) fireTogether(ctx context.Context, key string) []answer {
	answers := make([]answer, c.Concurrency)
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for i := range answers {
		ready.Add(1)
		done.Go(func() {
			ready.Done()
			<-start
			answers[i] = c.send(ctx, key, c.Body)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
	return answers
}

// allFailed returns an error when no request reached the target: every
// one failed to connect. Requests that connected and then got no answer in
// time are not that: a server that hangs on concurrent duplicates has a
// bug the checks must report (they fail), not an address to fix.
func allFailed(answers []answer) error {
	for _, a := range answers {
		if a.err == nil || !unreachable(a.err) {
			return nil
		}
	}
	return answers[0].err
}

// unreachable reports whether err means the request never reached a
// server: a refused or failed connection, an unknown host, a failed TLS
// handshake. A timeout counts only while connecting.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	return true
}

const (
	nameConcurrent = "concurrent duplicates"
	nameRetry      = "retry after completion"
	nameOtherBody  = "same key, other body"
	nameFreshKey   = "fresh key"
	nameCount      = "resources per key"
)

// judgeConcurrent judges check 1 and returns the original answer, the one
// that replays must match (nil when nothing succeeded).
func judgeConcurrent(answers []answer) (Result, *answer) {
	r := Result{ID: 1, Name: nameConcurrent, Statuses: map[string]int{}}
	var fresh, replays, conflicts, unexpected []*answer
	for i := range answers {
		a := &answers[i]
		r.Statuses[a.statusText()]++
		switch {
		case a.success() && a.replayed():
			replays = append(replays, a)
		case a.success():
			fresh = append(fresh, a)
		case a.err == nil && a.status == http.StatusConflict:
			conflicts = append(conflicts, a)
		default:
			unexpected = append(unexpected, a)
		}
	}
	successes := append(append([]*answer{}, fresh...), replays...)
	var original *answer
	if len(fresh) > 0 {
		original = fresh[0]
	} else if len(replays) > 0 {
		original = replays[0]
	}

	// Distinct successful answers: each one is an execution of its own.
	groups := map[string][]*answer{}
	var order []string
	for _, a := range successes {
		sig := signature(a)
		if _, ok := groups[sig]; !ok {
			order = append(order, sig)
		}
		groups[sig] = append(groups[sig], a)
	}
	tally := fmt.Sprintf("%d requests at once: %s", len(answers), tallyStatuses(r.Statuses))
	switch {
	case len(successes) == 0:
		r.Status = Fail
		r.Evidence = tally + "; no request succeeded"
	case len(groups) > 1:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; %d different successful answers: the operation ran more than once (duplicates)", tally, len(groups))
		for i, sig := range order {
			if i == maxDetails {
				r.Details = append(r.Details, fmt.Sprintf("… and %d more different answers", len(order)-i))
				break
			}
			r.Details = append(r.Details, fmt.Sprintf("%d× %s", len(groups[sig]), groups[sig][0].describe()))
		}
	case len(fresh) > 1 && len(replays) > 0:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; %d answers not marked %s while others are: the operation ran %d times", tally, len(fresh), headerReplayed, len(fresh))
	case len(fresh) == 0:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%s; %d identical replays but no fresh answer: the execution's own answer was not seen", tally, len(replays))
	case len(fresh) > 1:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%s; %d identical successful answers, none marked %s: replays cannot be told from executions (use --count-url)", tally, len(fresh), headerReplayed)
	default:
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%s; 1 fresh %d, %d identical replays, %d×409", tally, original.status, len(replays), len(conflicts))
	}
	if len(unexpected) > 0 && r.Status != Fail {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%s; %d unexpected answers (only a replay or 409 may answer a duplicate)", tally, len(unexpected))
	}
	for _, a := range unexpected {
		if len(r.Details) >= maxDetails {
			break
		}
		r.Details = append(r.Details, "unexpected: "+a.describe())
	}
	if r.Status != Fail && original != nil {
		// Identical bodies may still carry different result headers.
		for _, a := range successes[1:] {
			if st, diff := compareHeaders(original.header, a.header); st != Pass {
				r.Status = worse(r.Status, st)
				r.Details = append(r.Details, "headers differ: "+diff)
				break
			}
		}
	}
	return r, original
}

// signature identifies an answer for grouping: status, result headers and
// body bytes.
func signature(a *answer) string {
	return fmt.Sprintf("%d\x00%s\x00%s\x00%s\x00%s", a.status, a.header.Get("Location"),
		a.header.Get("Content-Type"), a.header.Get("Content-Location"), a.body)
}

func judgeRetry(original *answer, a answer) Result {
	r := Result{ID: 2, Name: nameRetry, Statuses: map[string]int{a.statusText(): 1}}
	if original == nil {
		r.Status = Skip
		r.Evidence = "no successful answer to replay"
		return r
	}
	if a.err != nil {
		r.Status = Fail
		r.Evidence = "no answer: " + errText(a.err)
		return r
	}
	if a.status == http.StatusConflict {
		r.Status = Fail
		r.Evidence = "409: still in flight after every request had answered"
		return r
	}
	if a.status != original.status {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("status %d, the original was %d", a.status, original.status)
		r.Details = []string{"got: " + a.describe(), "original: " + original.describe()}
		return r
	}
	if at := firstDiff(original.body, a.body); at >= 0 {
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d with a different body (%d bytes vs %d, first difference at byte %d): not a replay", a.status, len(a.body), len(original.body), at)
		r.Details = []string{"got: " + a.describe(), "original: " + original.describe()}
		return r
	}
	st, diff := compareHeaders(original.header, a.header)
	r.Status = st
	r.Evidence = fmt.Sprintf("%d replayed, body identical (%d bytes)", a.status, len(a.body))
	if diff != "" {
		r.Details = []string{"headers differ: " + diff}
	}
	if !a.replayed() {
		r.Status = worse(r.Status, Warn)
		r.Evidence += ", but not marked " + headerReplayed + ": true"
	} else {
		r.Evidence += ", marked " + headerReplayed
	}
	return r
}

func judgeOtherBody(a answer) Result {
	r := Result{ID: 3, Name: nameOtherBody, Statuses: map[string]int{a.statusText(): 1}}
	switch {
	case a.err != nil:
		r.Status = Fail
		r.Evidence = "no answer: " + errText(a.err)
	case a.status == http.StatusUnprocessableEntity:
		r.Status = Pass
		r.Evidence = "422: the reused key was refused"
		if ct := a.header.Get("Content-Type"); ct != "" {
			r.Evidence += " (" + ct + ")"
		}
	case a.status >= 400 && a.status < 500:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%d: refused, but 422 is the expected status for a key reused with another request", a.status)
	case a.success() && a.replayed():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d replay: the answer of another request was returned (the fingerprint is not checked)", a.status)
	case a.success():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d: a different request ran under a used key", a.status)
	default:
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d: want 422", a.status)
	}
	if r.Status == Fail && a.err == nil {
		r.Details = []string{"got: " + a.describe()}
	}
	return r
}

func judgeFreshKey(original *answer, a answer) Result {
	r := Result{ID: 4, Name: nameFreshKey, Statuses: map[string]int{a.statusText(): 1}}
	switch {
	case a.err != nil:
		r.Status = Fail
		r.Evidence = "no answer: " + errText(a.err)
	case !a.success():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d: a fresh key must run the operation again", a.status)
		r.Details = []string{"got: " + a.describe()}
	case a.replayed():
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d marked %s: another key's answer was replayed (the key is ignored)", a.status, headerReplayed)
	case original == nil:
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%d, a fresh execution", a.status)
	case a.header.Get("Location") != "" && a.header.Get("Location") == original.header.Get("Location"):
		r.Status = Fail
		r.Evidence = fmt.Sprintf("%d with the first key's Location %s: the fresh key got the same resource, not a new one", a.status, a.header.Get("Location"))
	case a.header.Get("Location") != "" && a.header.Get("Location") != original.header.Get("Location"):
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%d, a new resource (Location %s, the first key's was %s)", a.status, a.header.Get("Location"), original.header.Get("Location"))
	case !bytes.Equal(a.body, original.body):
		r.Status = Pass
		r.Evidence = fmt.Sprintf("%d, a new resource (the body differs from the first key's)", a.status)
	default:
		r.Status = Warn
		r.Evidence = fmt.Sprintf("%d with the same answer as the first key: a new resource cannot be told apart (use --count-url)", a.status)
	}
	return r
}

func judgeCounts(countURL string, counts []int, err error) Result {
	r := Result{ID: 5, Name: nameCount}
	switch {
	case countURL == "":
		r.Status = Skip
		r.Evidence = "no --count-url to count resources with"
	case err != nil:
		r.Status = Fail
		r.Evidence = "counting failed: " + errText(err)
	default:
		d1, d2 := counts[1]-counts[0], counts[2]-counts[1]
		r.Evidence = fmt.Sprintf("%d before, %d after the first key (%+d), %d after the second (%+d)", counts[0], counts[1], d1, counts[2], d2)
		if d1 == 1 && d2 == 1 {
			r.Status = Pass
		} else {
			r.Status = Fail
			r.Evidence += "; want +1 for each key"
			if d1 > 1 {
				r.Evidence += fmt.Sprintf(": %d duplicates", d1-1)
			}
		}
	}
	return r
}

// legitimatelyDiffer are the headers two answers to one operation may
// differ in: the moment, the connection, the session, request ids, and the
// replay marker itself.
var legitimatelyDiffer = map[string]bool{
	"Date": true, "Set-Cookie": true, "Idempotent-Replayed": true, "Content-Length": true,
	"Connection": true, "Keep-Alive": true, "Transfer-Encoding": true, "Age": true,
	"Retry-After": true, "Server-Timing": true, "Request-Id": true, "X-Request-Id": true,
	"X-Correlation-Id": true, "Traceparent": true, "Tracestate": true, "X-Trace-Id": true,
	"X-Amzn-Trace-Id": true, "X-Amzn-Requestid": true, "Cf-Ray": true, "Via": true,
	"X-Response-Time": true, "X-Runtime": true, "Alt-Svc": true, "Report-To": true, "Nel": true,
	"Expires": true, "X-Cache": true,
}

// resultHeaders describe the result itself: a difference there is a
// different answer.
var resultHeaders = map[string]bool{"Location": true, "Content-Type": true, "Content-Location": true, "Content-Encoding": true}

// compareHeaders compares two answers' headers, leaving out those that
// legitimately differ. A difference in a result header fails; in another
// one it warns.
func compareHeaders(a, b http.Header) (Status, string) {
	names := map[string]bool{}
	for n := range a {
		names[n] = true
	}
	for n := range b {
		names[n] = true
	}
	var diffs []string
	st := Pass
	for n := range names {
		l := strings.ToLower(n)
		if legitimatelyDiffer[n] || strings.HasPrefix(l, "x-ratelimit-") || strings.HasPrefix(l, "ratelimit") {
			continue
		}
		if strings.Join(a.Values(n), ", ") == strings.Join(b.Values(n), ", ") {
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s %q vs %q", n, strings.Join(a.Values(n), ", "), strings.Join(b.Values(n), ", ")))
		if resultHeaders[n] {
			st = Fail
		} else {
			st = worse(st, Warn)
		}
	}
	sort.Strings(diffs)
	return st, strings.Join(diffs, "; ")
}

func worse(a, b Status) Status {
	rank := map[Status]int{Skip: 0, Pass: 1, Warn: 2, Fail: 3}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// otherBody derives a body that asks for something else, keeping it
// acceptable to the endpoint's parser: a JSON object gets one more field,
// a form one more parameter, anything else a trailing newline. A server
// fingerprints bytes or a canonical form; either way these differ.
func otherBody(body []byte, contentType string) ([]byte, bool) {
	if len(body) == 0 {
		return nil, false
	}
	nonce := "idem-check-" + uuid.NewString()[:8]
	var obj map[string]json.RawMessage
	if json.Unmarshal(body, &obj) == nil && obj != nil {
		obj["idem_check_nonce"], _ = json.Marshal(nonce)
		out, err := json.Marshal(obj)
		return out, err == nil
	}
	if strings.HasPrefix(contentType, "application/x-www-form-urlencoded") || looksLikeForm(body) {
		return append(append([]byte{}, body...), "&idem_check_nonce="+nonce...), true
	}
	return append(append([]byte{}, body...), '\n'), true
}

func looksLikeForm(body []byte) bool {
	v, err := url.ParseQuery(string(body))
	return err == nil && len(v) > 0 && !bytes.ContainsAny(body, " \n{}[]")
}

func tallyStatuses(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

func firstDiff(a, b []byte) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}

// clip shows at most 120 bytes of a body on one line.
func clip(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	if s == "" {
		return "(empty)"
	}
	return s
}

// errText is an error on one line, without the "Post \"URL\":" prefix
// net/http adds.
func errText(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return strings.ReplaceAll(err.Error(), "\n", " ")
}
