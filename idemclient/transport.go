package idemclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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

	"github.com/google/uuid"
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
	DefaultMaxAttempts   = 5
	DefaultBaseDelay     = 100 * time.Millisecond
	DefaultMaxDelay      = 5 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
	DefaultMaxBodyBytes  = 8 << 20
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

	// MaxAttempts bounds the attempts of one request, the first included.
	// Defaults to 5. 1 disables retries but still sets the key.
	MaxAttempts int

	// BaseDelay is the backoff before the second attempt; the backoff
	// doubles with each attempt up to MaxDelay, and the pause actually
	// taken is drawn uniformly between zero and it (full jitter), so that
	// clients that failed together do not retry together. Defaults to
	// 100ms.
	BaseDelay time.Duration

	// MaxDelay caps the backoff. Defaults to 5s.
	MaxDelay time.Duration

	// MaxRetryAfter is the longest Retry-After the Transport waits for. A
	// response asking for a longer pause is returned to the caller instead
	// of being retried. Defaults to 30s.
	MaxRetryAfter time.Duration

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

	// KeyFunc makes a new key. Defaults to a random UUIDv4
	// (uuid.NewString).
	KeyFunc func() string
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

func (t *Transport) covers(req *http.Request) bool {
	if len(req.Header.Values(headerKey)) > 0 {
		return true
	}
	methods := t.Methods
	if len(methods) == 0 {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	return slices.ContainsFunc(methods, func(m string) bool { return strings.EqualFold(m, req.Method) })
}

func orDefault[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// RoundTrip sends req, retrying it as the package documentation describes.
// It returns the last response, or the last error when the last attempt
// got no response. When the request's context ends during a pause,
// RoundTrip returns the context's error.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	tr := TraceFrom(req.Context())
	if tr == nil {
		tr = &Trace{}
	}
	*tr = Trace{}
	if !t.covers(req) {
		tr.Attempts = 1
		resp, err := t.base().RoundTrip(req)
		tr.History = []Attempt{{Err: err}}
		if resp != nil {
			tr.History[0].Status = resp.StatusCode
			tr.Replayed = isReplay(resp)
			tr.History[0].Replayed = tr.Replayed
		}
		return resp, err
	}

	key := req.Header.Get(headerKey)
	if key == "" {
		key = t.newKey()
	}
	tr.Key = key

	body, err := t.rewindable(req)
	if err != nil {
		return nil, err
	}
	maxAttempts := orDefault(t.MaxAttempts, DefaultMaxAttempts)
	if body.once {
		maxAttempts = 1
	}

	ctx := req.Context()
	for attempt := 1; ; attempt++ {
		r := req.Clone(ctx)
		if r.Header == nil {
			r.Header = make(http.Header) // as http.Client does; Clone keeps a nil map
		}
		r.Header.Set(headerKey, key)
		if r.Body, err = body.open(attempt); err != nil {
			return nil, err
		}
		r.GetBody = body.getBody
		if body.length >= 0 {
			r.ContentLength = body.length
		}
		resp, err := t.send(r)
		tr.Attempts = attempt
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
		wait, retry := t.retryable(resp, err, attempt)
		if retry && attempt < maxAttempts && fitsDeadline(ctx, wait) {
			if resp != nil {
				discard(resp)
			}
			last.Wait = wait
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
			continue
		}
		if resp != nil {
			tr.Replayed = rec.Replayed
		}
		return resp, err
	}
}

func (t *Transport) newKey() string {
	if t.KeyFunc != nil {
		return t.KeyFunc()
	}
	return uuid.NewString()
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

// retryable says whether an attempt's outcome is worth another attempt with
// the same key, and how long to wait first.
func (t *Transport) retryable(resp *http.Response, err error, attempt int) (time.Duration, bool) {
	if err != nil {
		if !retryableError(err) {
			return 0, false
		}
		return t.backoff(attempt), true
	}
	if isReplay(resp) {
		return 0, false
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusTooManyRequests,
		http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
	default:
		return 0, false
	}
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		if d > orDefault(t.MaxRetryAfter, DefaultMaxRetryAfter) {
			return 0, false
		}
		return d, true
	}
	return t.backoff(attempt), true
}

// backoff is the pause after the given attempt: uniform in
// [0, min(MaxDelay, BaseDelay·2^(attempt-1))] ("full jitter").
func (t *Transport) backoff(attempt int) time.Duration {
	base := orDefault(t.BaseDelay, DefaultBaseDelay)
	ceiling := orDefault(t.MaxDelay, DefaultMaxDelay)
	d := ceiling
	if shift := attempt - 1; shift < 62 && base <= ceiling>>shift {
		d = base << shift
	}
	return rand.N(d + 1)
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
// (RFC 9110 §10.2.3). A date in the past means no wait.
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
