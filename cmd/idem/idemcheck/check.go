package idemcheck

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"regexp"
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

// ErrUnreachable is wrapped by the error Check returns when the target
// answered none of the requests (connection refused, DNS failure, every
// request timed out).
var ErrUnreachable = errors.New("cannot reach")

// Config says what to check. URL is required; every zero field means its
// documented default.
type Config struct {
	// URL is the endpoint under test, http or https. Its password, a user
	// name alone, and credential parameters (access_token=…) are never
	// printed: reports and errors show them as xxxxx (see the package
	// documentation).
	URL string

	// Method defaults to POST.
	Method string

	// Body is sent with every request. Check 3 derives another body from
	// it (see Check).
	Body []byte

	// Header is added to every request, the count requests included (so
	// an Authorization header scopes both alike). Its values are never
	// printed.
	Header http.Header

	// KeyHeader is the name of the idempotency key header. Defaults to
	// Idempotency-Key; some APIs use X-Idempotency-Key.
	KeyHeader string

	// Concurrency is how many identical requests check 1 releases at once.
	// Defaults to 20; at least 2.
	Concurrency int

	// CountURL, when set, is fetched with GET before and after the
	// requests; its answer, a JSON array (or an object with a "data"
	// array), counts the resources. Without it no run can show that
	// duplicates ran once: checks 1, 5 and 6 need it, and a run without
	// it never passes.
	CountURL string

	// Timeout bounds each request. Defaults to 10s.
	Timeout time.Duration

	// DisconnectAfter is how long after check 6 has sent its first request
	// it cuts the connection. Defaults to zero: at once, so that the server
	// reads a request whose client is already gone. Set it to about half
	// the handler's time to cut a slow handler midway.
	DisconnectAfter time.Duration

	// InFlightWait bounds how long check 6 keeps retrying while answered
	// 409, counted from the first 409. Defaults to 30s.
	InFlightWait time.Duration

	// Settle is how long check 6's count must stay the same before it is
	// taken as final, when the retry's answer was not a replay: the cut
	// request's execution then did not keep its key to the end, and may
	// still commit after the retry was answered. The count is taken again
	// until it has not changed for Settle (for at most three times as
	// long), and a second resource fails the check at once. Defaults to
	// 5s.
	Settle time.Duration

	// Client sends the requests. Defaults to a client with Timeout, a
	// connection pool sized for Concurrency, answers' headers bounded to
	// 64 KiB, and redirects not followed (a 303 is an answer to compare,
	// not a hop to take).
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

// Result is the outcome of one check. Its strings hold nothing the server
// sent unescaped, and no password.
type Result struct {
	// ID is the check's number, 1 to 6, as in the package documentation.
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
	// that got no answer, "cut" the request check 6 cut.
	Statuses map[string]int `json:"statuses,omitempty"`
	// Unproven, set on a check that did not fail, says why what it checks
	// was not observed, and what would let it be.
	Unproven string `json:"unproven,omitempty"`
}

// proven says whether the check observed what it checks.
func (r *Result) proven() bool {
	return (r.Status == Pass || r.Status == Warn) && r.Unproven == ""
}

// Report is the outcome of Check.
type Report struct {
	URL         string   `json:"url"` // credentials replaced by xxxxx
	Method      string   `json:"method"`
	Concurrency int      `json:"concurrency"`
	Keys        []string `json:"keys"` // the keys used: check 1–3's, check 4's, then check 6's
	Results     []Result `json:"checks"`
	// Proven lists what the run observed the endpoint to do, one claim
	// per check.
	Proven []string `json:"proven"`
	// NotProven lists the claims the run could not observe, each with
	// what would let it.
	NotProven []string `json:"not_proven,omitempty"`
	// Passed is true when no check failed and one execution per key was
	// observed: counted through CountURL (check 1 and check 5 proven).
	Passed bool `json:"passed"`
}

// claims are what each check proves when it passes.
var claims = map[int]string{
	1: "duplicates at one instant ran once",
	2: "a retry after completion gets the stored answer",
	3: "a key reused with another body is refused",
	4: "a fresh key runs the operation again",
	5: "one resource per key",
	6: "a retry after a disconnect does not run the operation again",
}

// Check runs the six checks against config.URL, in order. It returns an
// error, and no report, when the configuration is unusable or the target
// cannot be reached (wrapping ErrUnreachable); a target that answers
// wrongly gives a report with failed checks, not an error.
func Check(ctx context.Context, config Config) (*Report, error) {
	c, err := newChecker(config)
	if err != nil {
		return nil, err
	}
	defer c.closeIdle()
	rep, err := c.run(ctx)
	return rep, safeErr(err, c.secrets)
}

type checker struct {
	Config
	// ownClient is true when the checker made Client itself, and must
	// close its idle connections when done: a program calling Check in a
	// loop would otherwise keep 2×Concurrency connections per call.
	ownClient bool
	// secrets are the credentials of the configuration, never printed.
	secrets *secrets
}

func (c *checker) closeIdle() {
	if c.ownClient {
		c.Client.CloseIdleConnections()
	}
}

// newChecker checks config and fills in its defaults. Its errors are fit
// to print.
func newChecker(config Config) (*checker, error) {
	c := &checker{Config: config, secrets: newSecrets([]string{config.URL, config.CountURL}, config.Header)}
	if err := c.validate(); err != nil {
		return nil, safeErr(err, c.secrets)
	}
	return c, nil
}

func (c *checker) validate() error {
	if err := validURL(c.URL); err != nil {
		return err
	}
	if c.CountURL != "" {
		if err := validURL(c.CountURL); err != nil {
			return fmt.Errorf("count URL: %w", err)
		}
	}
	if c.Method == "" {
		c.Method = http.MethodPost
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	if c.Header.Get(c.KeyHeader) != "" {
		return fmt.Errorf("do not set %s: the check makes its own keys", c.KeyHeader)
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Concurrency < 2 {
		return fmt.Errorf("concurrency must be at least 2, got %d", c.Concurrency)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.DisconnectAfter < 0 {
		return fmt.Errorf("disconnect delay must not be negative, got %v", c.DisconnectAfter)
	}
	if c.InFlightWait <= 0 {
		c.InFlightWait = DefaultInFlightWait
	}
	if c.Settle < 0 {
		return fmt.Errorf("settle must not be negative, got %v", c.Settle)
	}
	if c.Settle == 0 {
		c.Settle = DefaultSettle
	}
	if c.Client == nil {
		c.Client = newHTTPClient(c.Timeout, c.Concurrency)
		c.ownClient = true
	}
	if c.KeyFunc == nil {
		c.KeyFunc = uuid.NewString
	}
	return nil
}

func validURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("bad URL %q: %s", redactURL(raw), parseProblem(raw, err))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("bad URL %q: want http://host/path or https://host/path", redactURL(raw))
	}
	return nil
}

// quoted matches a string quoted as %q writes it.
var quoted = regexp.MustCompile(`\s*"(?:[^"\\]|\\.)*"`)

// parseProblem says why url.Parse refused raw, without the pieces of raw
// its error quotes (the URL, ":s3cr" of a port): they may be pieces of a
// password. When raw seems to have user info, it says how to write it.
func parseProblem(raw string, err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	problem := quoted.ReplaceAllString(err.Error(), "")
	if rest, ok := afterScheme(raw); !ok || strings.Contains(rest, "@") {
		problem += ` (in a user name or password, write / ? # @ % space and " percent-encoded: %2F %3F %23 %40 %25 %20 %22)`
	}
	return problem
}

func newHTTPClient(timeout time.Duration, conns int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = conns * 2
	tr.MaxIdleConnsPerHost = conns * 2
	tr.MaxResponseHeaderBytes = maxHeaderBytes
	return &http.Client{
		Transport:     tr,
		Timeout:       timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (c *checker) newRequest(ctx context.Context, key string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, c.Method, c.URL, bytes.NewReader(body))
	if err != nil {
		return nil, err
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
	return req, nil
}

func (c *checker) send(ctx context.Context, key string, body []byte) answer {
	req, err := c.newRequest(ctx, key, body)
	if err != nil {
		return answer{err: err}
	}
	resp, err := c.Client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	a := readAnswer(resp)
	// The part of the body a report may show, with any credential of the
	// configuration the server echoed hidden here rather than once clipped
	// (a clipped one would show in part). Bodies are compared by their
	// hash, not by this.
	a.body = []byte(c.secrets.scrub(string(a.body), false))
	return a
}

// counter takes the counts of CountURL through a run; the first failure
// stops it.
type counter struct {
	c   *checker
	n   []int
	err error
}

func (k *counter) take(ctx context.Context) {
	if k.c.CountURL == "" || k.err != nil {
		return
	}
	n, err := k.c.count(ctx)
	if err != nil {
		k.err = err
		return
	}
	k.n = append(k.n, n)
}

// last is the latest count, false when there is none.
func (k *counter) last() (int, bool) {
	if k.err != nil || len(k.n) == 0 {
		return 0, false
	}
	return k.n[len(k.n)-1], true
}

func (c *checker) run(ctx context.Context) (*Report, error) {
	key1, key2, key3 := c.KeyFunc(), c.KeyFunc(), c.KeyFunc()
	rep := &Report{URL: c.secrets.text(shownURL(c.URL)), Method: safeText(c.Method), Concurrency: c.Concurrency, Keys: []string{key1, key2}}

	counts := &counter{c: c}
	counts.take(ctx) // before
	if counts.err != nil {
		if errors.As(counts.err, new(*url.Error)) {
			return nil, fmt.Errorf("%w %s: %s", ErrUnreachable, redactURL(c.CountURL), errText(counts.err))
		}
		return nil, counts.err
	}

	answers := c.fireTogether(ctx, key1)
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if err := allFailed(answers); err != nil {
		return nil, fmt.Errorf("%w %s: %s", ErrUnreachable, redactURL(c.URL), errText(err))
	}
	before1, _ := counts.last()
	counts.take(ctx) // after check 1
	after1, counted1 := counts.last()
	r1, original := judgeConcurrent(answers)
	retry := c.send(ctx, key1, c.Body)
	if unmarked := countUnmarked(answers); unmarked > 1 && retry.success() && retry.replayed() {
		// The server marks its replays (the retry was), so several
		// unmarked successes are several executions, identical or not.
		r1.Status = Fail
		r1.Evidence = fmt.Sprintf("%d requests at once: %s; %d successful answers not marked %s, from a server that marks its replays (check 2): the operation ran %d times",
			len(answers), tallyStatuses(r1.Statuses), unmarked, headerReplayed, unmarked)
	}
	countConcurrent(&r1, c.CountURL != "", counted1, after1-before1)
	rep.Results = append(rep.Results, r1)

	rep.Results = append(rep.Results, judgeRetry(original, retry))

	if other, ok := otherBody(c.Body, c.Header.Get("Content-Type")); ok {
		rep.Results = append(rep.Results, judgeOtherBody(c.send(ctx, key1, other)))
	} else {
		rep.Results = append(rep.Results, Result{ID: 3, Name: nameOtherBody, Status: Skip,
			Evidence: "no body to vary (-d): nothing to compare a fingerprint against",
			Unproven: "no body to vary (give -d)"})
	}
	counts.take(ctx) // after checks 2 and 3: the first key's last request

	rep.Results = append(rep.Results, judgeFreshKey(original, c.send(ctx, key2, c.Body)))
	counts.take(ctx) // after check 4: the second key
	var r5 Result
	if len(counts.n) == 4 {
		r5 = judgeCounts(c.CountURL, []int{counts.n[0], counts.n[2], counts.n[3]}, nil)
	} else {
		r5 = judgeCounts(c.CountURL, nil, counts.err)
	}

	if c.CountURL != "" {
		rep.Keys = append(rep.Keys, key3)
	}
	r6 := c.disconnectThenRetry(ctx, key3, counts, retry.success() && retry.replayed())
	rep.Results = append(rep.Results, r5, r6)
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}

	if rep.Results[4].Status == Pass {
		// One new resource per key: what the answers of checks 2 and 4
		// could not tell (a replay or a new execution?), the count did.
		rep.Results[1].Unproven, rep.Results[3].Unproven = "", ""
	}
	failed := false
	for i := range rep.Results {
		r := &rep.Results[i]
		r.Evidence = c.secrets.text(r.Evidence)
		r.Unproven = c.secrets.text(r.Unproven)
		for j := range r.Details {
			r.Details[j] = c.secrets.text(r.Details[j])
		}
		claim := fmt.Sprintf("%d. %s", r.ID, claims[r.ID])
		switch {
		case r.Status == Fail:
			failed = true
			r.Unproven = "" // a failure was observed: nothing left unproven
		case r.proven():
			rep.Proven = append(rep.Proven, claim)
		default:
			reason := r.Unproven
			if reason == "" {
				reason = r.Evidence
			}
			rep.NotProven = append(rep.NotProven, claim+": "+reason)
		}
	}
	// Answers alone cannot show that duplicates ran once: a server may
	// run each and answer all with the first stored answer. Only counts
	// prove it.
	rep.Passed = !failed && rep.Results[0].proven() && rep.Results[4].proven()
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
// server that speaks HTTP: a refused or failed connection, an unknown
// host, a failed TLS handshake. A server that was reached and then hung,
// closed the connection, or answered something net/http refuses (a
// malformed answer, a header over the bound) fails the checks instead.
func unreachable(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var (
		dns         *net.DNSError
		recordErr   tls.RecordHeaderError
		alert       tls.AlertError
		verifyErr   *tls.CertificateVerificationError
		unknownAuth x509.UnknownAuthorityError
		hostnameErr x509.HostnameError
	)
	return errors.As(err, &dns) || errors.As(err, &recordErr) || errors.As(err, &alert) ||
		errors.As(err, &verifyErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostnameErr)
}
