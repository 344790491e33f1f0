package idemclient

import (
	"bytes"
	"context"
	cryptorand "crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The header names of the contract. They match idemhttp.HeaderKey and
// idemhttp.HeaderReplayed; they are repeated here so that a client does
// not import the server middleware.
const (
	headerKey      = "Idempotency-Key"
	headerReplayed = "Idempotent-Replayed"
)

// Defaults for Transport.
const (
	DefaultMaxAttempts     = 5
	DefaultBaseDelay       = 100 * time.Millisecond
	DefaultMaxDelay        = 5 * time.Second
	DefaultMaxRetryAfter   = 30 * time.Second
	DefaultInFlightTimeout = 2 * time.Minute
	DefaultMaxBodyBytes    = 8 << 20
)

// ErrAttemptTimeout is recorded in Trace.History, and returned (wrapped)
// when the last attempt timed out: the attempt took longer than
// Transport.AttemptTimeout to receive the response headers.
var ErrAttemptTimeout = errors.New("idemclient: attempt timed out")

// Transport is an http.RoundTripper that sends covered requests with an
// Idempotency-Key and retries them with that same key. The zero value is
// ready to use; every zero field means its documented default. A Transport
// is safe for concurrent use once its fields are no longer changed.
type Transport struct {
	// Base sends each attempt. Defaults to http.DefaultTransport.
	Base http.RoundTripper

	// Methods are the covered methods: they get a key and are retried.
	// Defaults to POST and PATCH. A request of another method is covered
	// too when the caller set an Idempotency-Key on it.
	Methods []string

	// MaxAttempts bounds the attempts of one operation that fail: a
	// connection error, a timeout, 429, 502, 503 or 504. After that many
	// failed attempts, the first included, the last outcome is returned.
	// Answers 409 do not count: InFlightTimeout bounds them. Defaults to
	// 5. 1 disables retries after a failure but still sets the key.
	MaxAttempts int

	// BaseDelay is the backoff ceiling before the first retry; the
	// ceiling doubles with each retry up to MaxDelay. The pause taken is
	// drawn uniformly between half the ceiling and the ceiling, so that
	// clients that failed together do not retry together, and no pause is
	// shorter than half of BaseDelay, whatever a Retry-After says.
	// Failures and 409s keep separate counts. Defaults to 100ms.
	BaseDelay time.Duration

	// MaxDelay caps the backoff. Defaults to 5s.
	MaxDelay time.Duration

	// MaxRetryAfter is the longest Retry-After the Transport waits for
	// after a 429, 502, 503 or 504. A response asking for a longer pause is
	// returned to the caller instead of being retried. Defaults to 30s.
	// InFlightTimeout, not this, bounds the pauses after a 409.
	MaxRetryAfter time.Duration

	// InFlightTimeout is how long the Transport keeps retrying an
	// operation answered 409 (in flight: another execution holds the
	// key), counted from the first 409. A pause after a 409 is the
	// backoff, or the Retry-After when that is longer; a Retry-After that
	// ends past the budget returns the 409 at once, and the last retry is
	// sent when the budget ends. Size it above the server's lease (idem's
	// default lease is 90s): an execution whose process died holds the
	// key until its lease ends, and only then may a retry take the key
	// over and get an answer; a client that stops before that gets 409
	// for an operation the server may have begun (charged a card) and
	// not finished. A live but slow execution keeps its key as long as it
	// runs, so size the budget above the slowest handler too. Defaults to
	// 2 minutes. A negative value returns a 409 at once.
	InFlightTimeout time.Duration

	// AttemptTimeout bounds each attempt, from sending it to receiving the
	// response headers (an idem-protected server sends them after its
	// commit). A slow attempt is abandoned and retried with the same key:
	// the server answers 409 while the first execution still runs, then
	// its stored result. That needs a server that lets an execution
	// finish when its client goes away (Stripe does); one that ends it
	// with the request rolls it back and releases the key, and the retry
	// runs it again. Zero means no per-attempt bound; the request's
	// context still bounds the whole call.
	AttemptTimeout time.Duration

	// MaxBodyBytes is the largest request body buffered for retries when
	// the request has no GetBody (http.NewRequest sets GetBody for
	// *bytes.Buffer, *bytes.Reader and *strings.Reader bodies, which are
	// never buffered again). A larger body is sent once, not retried.
	// Defaults to 8 MiB.
	MaxBodyBytes int64

	// KeyFunc makes a new key. Defaults to a random UUIDv4.
	KeyFunc func() string

	// Tracer observes the attempts and retries of covered requests.
	// Defaults to none.
	Tracer ClientTracer
}

// NewClient returns an http.Client whose transport is t. A nil t means a
// Transport with every default.
func NewClient(t *Transport) *http.Client {
	if t == nil {
		t = &Transport{}
	}
	return &http.Client{Transport: t}
}

var _ http.RoundTripper = (*Transport)(nil)

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

func (t *Transport) coversMethod(method string) bool {
	methods := t.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	return slices.ContainsFunc(methods, func(m string) bool { return strings.EqualFold(m, method) })
}

// redirectedKey returns the key of the operation that req continues, when
// http.Client made req to follow a 307 or 308: those redirects ask for the
// same request, method and body, at another address, so it is the same
// operation and must carry the same key. http.Client builds each hop from
// the caller's original request, which never had the key the Transport
// made; the previous hop's response leads back to the request the
// Transport actually sent, key included. Other redirects (301, 302, 303)
// turn the request into a GET for the result: a new request, not the
// operation again.
func redirectedKey(req *http.Request) string {
	prev := req.Response
	if prev == nil || prev.Request == nil {
		return ""
	}
	if prev.StatusCode != http.StatusTemporaryRedirect && prev.StatusCode != http.StatusPermanentRedirect {
		return ""
	}
	if !strings.EqualFold(prev.Request.Method, req.Method) {
		return ""
	}
	return prev.Request.Header.Get(headerKey)
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// RoundTrip sends req, retrying it as the package documentation describes.
// It returns the last response, or the last error when the last attempt
// got no response. When the request's context has ended before an
// attempt, or ends during a pause, RoundTrip sends nothing more and
// returns the context's error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := TraceFrom(req.Context())
	if tr == nil {
		tr = &Trace{}
	} else if req.Response == nil {
		// A new call; a redirect hop (Response set) adds to the trace of
		// the call it belongs to.
		*tr = Trace{}
	}

	// The caller's key wins: http.Client copies it onto every hop, and a
	// CheckRedirect that changed it meant it.
	key := req.Header.Get(headerKey)
	if key == "" {
		key = redirectedKey(req)
	}
	if key == "" && !t.coversMethod(req.Method) {
		tr.Attempts++
		resp, err := t.base().RoundTrip(req)
		rec := Attempt{Err: err}
		if resp != nil {
			rec.Status = resp.StatusCode
			rec.Replayed = isReplay(resp)
		}
		tr.Replayed = rec.Replayed
		tr.History = append(tr.History, rec)
		return resp, err
	}
	if key == "" {
		key = t.newKey()
	}
	tr.Key = key

	body, err := t.rewindable(req)
	if err != nil {
		return nil, err
	}

	ctx := req.Context()
	var budget retryBudget
	for {
		if ctx.Err() != nil {
			// The caller gave up before this attempt: before the first
			// one, as a pause ended, or while http.Client was following a
			// redirect. Nothing more is sent.
			if budget.attempts == 0 && body.first != nil {
				_ = body.first.Close() // a RoundTripper closes the body it was given
			}
			return nil, context.Cause(ctx)
		}
		actx := ctx
		if t.Tracer != nil {
			actx = t.Tracer.TraceAttemptStart(ctx, TraceAttemptStartData{Method: req.Method, Resend: budget.attempts})
		}
		r := req.Clone(actx)
		if r.Header == nil {
			r.Header = make(http.Header) // as http.Client does; Clone keeps a nil map
		}
		r.Header.Set(headerKey, key)
		if r.Body, err = body.open(budget.attempts + 1); err != nil {
			return nil, err
		}
		r.GetBody = body.getBody
		if body.length >= 0 {
			r.ContentLength = body.length
		}
		start := time.Now()
		resp, err := t.send(r)
		var outcome AttemptOutcome
		if t.Tracer != nil {
			outcome = attemptOutcome(ctx, resp, err)
			end := TraceAttemptEndData{Method: req.Method, Resend: budget.attempts, Outcome: outcome, Duration: time.Since(start), Err: err}
			if resp != nil {
				end.Status = resp.StatusCode
			}
			t.Tracer.TraceAttemptEnd(actx, end)
		}
		budget.attempts++
		tr.Attempts++
		rec := Attempt{Err: err}
		if resp != nil {
			rec.Status = resp.StatusCode
			rec.Replayed = isReplay(resp)
		}
		tr.History = append(tr.History, rec)
		last := &tr.History[len(tr.History)-1]
		if err != nil && ctx.Err() != nil {
			// The caller gave up: no pause, no further attempt.
			return nil, err
		}
		wait, retry := t.retry(resp, err, &budget, time.Now())
		if retry && !body.once && fitsDeadline(ctx, wait) {
			if resp != nil {
				discard(resp)
			}
			last.Wait = wait
			if t.Tracer != nil {
				t.Tracer.TraceRetry(ctx, TraceRetryData{Reason: outcome, Wait: wait, Resend: budget.attempts})
			}
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
			continue
		}
		if resp != nil {
			tr.Replayed = rec.Replayed
			if resp.Request == nil || resp.Request.Header.Get(headerKey) != key {
				// The request sent, key included, is what a 307 or 308
				// hop finds the key through (redirectedKey).
				resp.Request = r
			}
		}
		return resp, err
	}
}

func (t *Transport) newKey() string {
	if t.KeyFunc != nil {
		return t.KeyFunc()
	}
	return newUUID()
}

// newUUID returns a random (version 4) UUID in its canonical text form.
func newUUID() string {
	var u [16]byte
	_, _ = cryptorand.Read(u[:]) // never fails (crypto/rand documents it)
	u[6] = u[6]&0x0f | 0x40      // version 4
	u[8] = u[8]&0x3f | 0x80      // RFC 9562 variant
	var out [36]byte
	hex.Encode(out[0:8], u[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], u[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], u[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], u[8:10])
	out[23] = '-'
	hex.Encode(out[24:], u[10:])
	return string(out[:])
}

// send makes one attempt, bounded by AttemptTimeout until the response
// headers arrive. The bound is a timer rather than a context deadline so
// that it stops once the headers are in: reading a large body must not be
// cut by a bound meant for a stuck server.
func (t *Transport) send(r *http.Request) (*http.Response, error) {
	if t.AttemptTimeout <= 0 {
		return t.base().RoundTrip(r)
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	timer := time.AfterFunc(t.AttemptTimeout, func() { cancel(ErrAttemptTimeout) })
	resp, err := t.base().RoundTrip(r.WithContext(ctx))
	if !timer.Stop() {
		// The timer fired: whatever came back was cut by it.
		if resp != nil {
			discard(resp)
		}
		cancel(nil)
		if r.Context().Err() != nil {
			return nil, context.Cause(r.Context())
		}
		return nil, fmt.Errorf("%w after %v", ErrAttemptTimeout, t.AttemptTimeout)
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: func() { cancel(nil) }}
	return resp, nil
}

// cancelOnClose releases an attempt's context when its body is closed, as
// the caller's Close ends the use of the attempt.
type cancelOnClose struct {
	io.ReadCloser
	cancel func()
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// retryBudget is what one operation has spent of its two budgets: failed
// attempts, against MaxAttempts, and time since the first 409, against
// InFlightTimeout.
type retryBudget struct {
	attempts  int       // attempts sent
	failures  int       // attempts that failed (not 409)
	conflicts int       // attempts answered 409
	inFlight  time.Time // when the first 409 came back
}

// retry says whether an attempt's outcome is worth another attempt with the
// same key, and how long to wait first. It charges the attempt to its
// budget.
func (t *Transport) retry(resp *http.Response, err error, b *retryBudget, now time.Time) (time.Duration, bool) {
	if err != nil {
		if !retryableError(err) {
			return 0, false
		}
		return t.afterFailure(b, 0)
	}
	if isReplay(resp) {
		return 0, false
	}
	retryAfter, hasRetryAfter := parseRetryAfter(resp.Header.Get("Retry-After"), now)
	switch resp.StatusCode {
	case http.StatusConflict:
		return t.afterConflict(b, retryAfter, hasRetryAfter, now)
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if hasRetryAfter && retryAfter > orDefault(t.MaxRetryAfter, DefaultMaxRetryAfter) {
			return 0, false
		}
		return t.afterFailure(b, retryAfter)
	}
	return 0, false
}

// afterFailure charges a failed attempt to MaxAttempts. The pause is the
// backoff, or retryAfter when longer.
func (t *Transport) afterFailure(b *retryBudget, retryAfter time.Duration) (time.Duration, bool) {
	b.failures++
	if b.failures >= orDefault(t.MaxAttempts, DefaultMaxAttempts) {
		return 0, false
	}
	return max(t.backoff(b.failures), retryAfter), true
}

// afterConflict charges a 409 to InFlightTimeout. The pause is the
// backoff, or the Retry-After when longer, cut short so that the last
// retry goes out when the budget ends: a client sized to outlive a dead
// holder's lease then asks once more after it. A Retry-After past the
// budget's end returns the 409.
func (t *Transport) afterConflict(b *retryBudget, retryAfter time.Duration, hasRetryAfter bool, now time.Time) (time.Duration, bool) {
	limit := orDefault(t.InFlightTimeout, DefaultInFlightTimeout)
	if t.InFlightTimeout < 0 {
		return 0, false
	}
	b.conflicts++
	if b.inFlight.IsZero() {
		b.inFlight = now
	}
	left := limit - now.Sub(b.inFlight)
	if left <= 0 || (hasRetryAfter && retryAfter > left) {
		return 0, false
	}
	return min(max(t.backoff(b.conflicts), retryAfter), left), true
}

// backoff is the pause before the n-th retry of a kind (failure or 409):
// uniform in [c/2, c] where c = min(MaxDelay, BaseDelay·2^(n-1)). The
// lower half keeps a floor under every pause, so that a server answering
// Retry-After: 0 (or a date in the past) cannot make the Transport spend
// its attempts in a burst; the upper half spreads clients that failed
// together.
func (t *Transport) backoff(n int) time.Duration {
	base := orDefault(t.BaseDelay, DefaultBaseDelay)
	ceiling := orDefault(t.MaxDelay, DefaultMaxDelay)
	c := ceiling
	if shift := n - 1; shift < 62 && base <= ceiling>>shift {
		c = base << shift
	}
	half := c / 2
	return half + rand.N(c-half+1)
}

// retryableError says whether a transport error may be transient. Only
// errors that no retry can fix are excluded: certificate failures and a
// TLS handshake with a plain HTTP server.
func retryableError(err error) bool {
	var (
		verifyErr    *tls.CertificateVerificationError
		unknownAuth  x509.UnknownAuthorityError
		hostnameErr  x509.HostnameError
		invalidCert  x509.CertificateInvalidError
		recordHeader tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &verifyErr), errors.As(err, &unknownAuth), errors.As(err, &hostnameErr),
		errors.As(err, &invalidCert), errors.As(err, &recordHeader):
		return false
	}
	return true
}

// parseRetryAfter reads Retry-After as delay-seconds or an HTTP date
// (RFC 9110 §10.2.3). A date in the past reads as zero; a negative or
// unreadable value as absent. Either way the backoff still applies.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	secs, err := strconv.ParseInt(v, 10, 64)
	if errors.Is(err, strconv.ErrRange) && !strings.HasPrefix(v, "-") {
		err, secs = nil, math.MaxInt64 // all digits, only too many: a very long wait
	}
	if err == nil {
		if secs < 0 {
			return 0, false
		}
		if secs > int64(24*time.Hour/time.Second) {
			secs = int64(24 * time.Hour / time.Second)
		}
		return time.Duration(secs) * time.Second, true
	}
	at, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(at.Sub(now), 0), true
}

// fitsDeadline says whether a pause of d leaves the context alive: when it
// would not, the last answer is more use to the caller than a context
// error after a pointless wait.
func fitsDeadline(ctx context.Context, d time.Duration) bool {
	deadline, ok := ctx.Deadline()
	return !ok || time.Until(deadline) > d
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func isReplay(resp *http.Response) bool {
	return strings.EqualFold(strings.TrimSpace(resp.Header.Get(headerReplayed)), "true")
}

// discard drains a little of a response that will not be returned, so the
// connection can be reused, and closes it.
func discard(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
}

// body gives each attempt the same request body bytes.
type body struct {
	first   io.ReadCloser // the caller's body, for the first attempt
	getBody func() (io.ReadCloser, error)
	once    bool  // the body could not be kept: one attempt only
	length  int64 // the buffered length, or -1 to keep the request's
}

func (b *body) open(attempt int) (io.ReadCloser, error) {
	if attempt == 1 || b.getBody == nil {
		return b.first, nil
	}
	rc, err := b.getBody()
	if err != nil {
		return nil, fmt.Errorf("idemclient: rewinding the request body: %w", err)
	}
	return rc, nil
}

// rewindable arranges for the request body to be sent again: through the
// request's GetBody when it has one, else by buffering it.
func (t *Transport) rewindable(req *http.Request) (*body, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return &body{first: req.Body, getBody: func() (io.ReadCloser, error) { return http.NoBody, nil }, length: -1}, nil
	}
	if req.GetBody != nil {
		return &body{first: req.Body, getBody: req.GetBody, length: -1}, nil
	}
	// One byte past the limit tells "at the limit" from "over it"; kept
	// below MaxInt64 so that "no limit" written as math.MaxInt64 does not
	// overflow into a negative limit, which reads nothing.
	limit := min(orDefault(t.MaxBodyBytes, DefaultMaxBodyBytes), math.MaxInt64-1)
	buf, err := io.ReadAll(io.LimitReader(req.Body, limit+1))
	if err != nil {
		_ = req.Body.Close()
		return nil, fmt.Errorf("idemclient: reading the request body: %w", err)
	}
	if int64(len(buf)) > limit {
		// Too large to keep: send what was read followed by the rest, once.
		rest := req.Body
		return &body{first: readCloser{io.MultiReader(bytes.NewReader(buf), rest), rest}, once: true, length: -1}, nil
	}
	_ = req.Body.Close()
	getBody := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	first, _ := getBody()
	return &body{first: first, getBody: getBody, length: int64(len(buf))}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}
