package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

// Defaults for Config.
const (
	DefaultRetryAfter         = idemfront.DefaultRetryAfter
	DefaultMaxRequestBody     = 1 << 20
	DefaultMaxResponseBody    = 1 << 20
	DefaultMaxStoredErrorBody = 8 << 10
)

// DefaultUnstoredStatuses are the statuses stored nowhere when
// Config.UnstoredStatuses is nil: answers that say the endpoint did not
// execute the request. 404 and 405 are what a router answers for a path
// or a method it does not serve; 307 and 308 are its redirects to the
// canonical URL (a trailing slash, a host), after which the client sends
// the request again, to another URL; 429 says a limit was reached
// downstream, which is no result: replaying it for the retention would
// refuse the operation long after the limit has passed. Such an answer is
// sent, its business writes are rolled back, and the key is released, so
// that a retry runs. 301, 302 and 303 are not in the list: a POST handler
// that answers 303 See Other after creating a resource did execute.
var DefaultUnstoredStatuses = []int{
	http.StatusTemporaryRedirect,
	http.StatusPermanentRedirect,
	http.StatusNotFound,
	http.StatusMethodNotAllowed,
	http.StatusTooManyRequests,
}

// DefaultMethods are the methods covered when Config.Methods is empty:
// the ones that are not idempotent by definition. PUT and DELETE are, and
// GET must be safe, so retrying them needs no key.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultReplayHeaders are the response headers stored and replayed: the
// ones that describe the result itself. Headers about the connection, the
// moment or the session (Date, Set-Cookie, hop-by-hop fields) are never
// replayed; Config.ReplayHeaders adds to this list.
//
// The security headers a handler sets on its answer (Content-Security-Policy,
// X-Content-Type-Options, X-Frame-Options, …) are in the list: a replayed
// HTML page or JSON document without them would be open to the attacks
// they keep off the first answer.
var DefaultReplayHeaders = []string{
	"Cache-Control",
	"Content-Disposition",
	"Content-Encoding",
	"Content-Language",
	"Content-Location",
	"Content-Type",
	"ETag",
	"Expires",
	"Last-Modified",
	"Link",
	"Location",
	"Retry-After",
	"Vary",

	"Content-Security-Policy",
	"Content-Security-Policy-Report-Only",
	"Cross-Origin-Embedder-Policy",
	"Cross-Origin-Embedder-Policy-Report-Only",
	"Cross-Origin-Opener-Policy",
	"Cross-Origin-Opener-Policy-Report-Only",
	"Cross-Origin-Resource-Policy",
	"Permissions-Policy",
	"Referrer-Policy",
	"Strict-Transport-Security",
	"X-Content-Type-Options",
	"X-Frame-Options",
}

// neverReplayed are the headers a replay must not carry whatever the
// configuration says: a cookie handed out again to whoever retries, a
// stale Date, fields that describe one connection, or the two headers
// the middleware sets itself.
var neverReplayed = []string{
	"Set-Cookie",
	"Set-Cookie2",
	"Date",
	"Connection",
	"Keep-Alive",
	"Proxy-Connection",
	"Proxy-Authenticate",
	"Proxy-Authorization",
	"Te",
	"Trailer",
	"Transfer-Encoding",
	"Upgrade",
	"Content-Length", // recomputed from the stored body
	HeaderKey,
	HeaderReplayed,
}

// Config configures a Middleware. A tenant rule (TenantFunc, or
// SharedKeySpace) is required; the zero value of every other field means
// its documented default.
type Config struct {
	// Methods are the request methods the middleware protects; others pass
	// through untouched, without the Idempotency-Key echo. Defaults to
	// DefaultMethods (POST, PATCH).
	Methods []string

	// KeyHeader names the request header that carries the key, for an
	// API that calls it otherwise (X-Idempotency-Key). Its value follows
	// the rules of ParseKey, and every answer to a request that carried
	// it echoes it under the same name. Defaults to Idempotency-Key.
	KeyHeader string

	// KeyFunc reads the key from the request instead of a header (a query
	// parameter, a header of a gateway's own format): "" means the request
	// carries none, an error is answered as an invalid key (400), and a key
	// it returns must pass idem.ValidateKey. It runs before the body is
	// read, so it must not read r.Body. The key it returns is not echoed.
	// Set KeyHeader or KeyFunc, not both.
	KeyFunc func(r *http.Request) (string, error)

	// RequireKey makes a covered request without Idempotency-Key a 400
	// problem. Defaults to false: such a request passes through
	// unprotected, as Stripe does.
	RequireKey bool

	// TenantFunc names the owner of the request's key space, from what the
	// server knows of the caller (its authenticated identity), never from
	// a header the client sets freely: two callers who send the same key
	// then name two operations, and neither can replay the other's answer
	// or learn that a key was used. An error answers 401 and nothing is
	// stored. Authentication normally sits in front of this middleware and
	// has already refused unknown callers; TenantFunc only reads what it
	// left in the request context. A tenant that is not valid UTF-8 or
	// holds a control character (C0, DEL or C1) is a bug of the server
	// (idemfront.ValidateTenant): it is never used, the request is
	// answered 500 and the error logged, rather than fail in the store as
	// an outage every retry meets again (idem keeps control-character
	// tenants for its own use: the inbox's start with 0x1f).
	//
	// Required unless SharedKeySpace is set.
	TenantFunc func(r *http.Request) (string, error)

	// SharedKeySpace puts every caller in one key space (the tenant ""),
	// when TenantFunc is nil. Then any caller who sends another's key and
	// body gets the other's answer replayed, and one who sends another
	// body learns that the key was used: choose it only for an API with a
	// single caller (a service called by one other), or whose keys are
	// unguessable and whose answers are no secret. NewMiddleware refuses a Config
	// with neither TenantFunc nor SharedKeySpace, and one with both.
	SharedKeySpace bool

	// FingerprintHeaders are request headers that take part in the
	// fingerprint besides method, path, query, media type and body (for
	// example a header that selects an API version). Defaults to none.
	FingerprintHeaders []string

	// IgnoreMediaType leaves the request's media type (the type/subtype of
	// its Content-Type, lowercased, without parameters) out of the
	// fingerprint. Defaults to false: the same bytes sent as JSON and as
	// a form are two requests, which a handler may read differently, so a
	// retry under another media type gets 422. Set it for a while after
	// upgrading from a version that did not fingerprint the media type:
	// the fingerprints of requests stored before carry none.
	IgnoreMediaType bool

	// CanonicalJSON fingerprints a body that is one JSON text by its
	// canonical form (AppendCanonicalJSON): object member order,
	// insignificant whitespace and the escapes that spell a string do not
	// count; numbers count as written (1 and 1.0 differ). A body that is
	// not JSON (or is empty, or nests deeper than 64 levels) is
	// fingerprinted by its bytes, as without the option, and never like a
	// JSON body: the handler then answers it as it answers any malformed
	// body. It costs about what hashing the body once more does, however
	// the body nests (BenchmarkCanonicalJSONDeep). Defaults to false: the
	// body's bytes. Switching it on changes the fingerprint of every JSON
	// body: a retry of a request stored before gets 422.
	CanonicalJSON bool

	// IgnoreJSON are JSON Pointers (RFC 6901) to the members of a JSON
	// body left out of its fingerprint: a client timestamp, a rotating
	// token, which differ between a request and its retry. It implies
	// CanonicalJSON. A member it names counts the same whether present
	// or not; an array element it names counts as an element.
	IgnoreJSON []string

	// FingerprintFunc replaces the whole fingerprint: what it returns for
	// a request (whose body has been read into body; r.Body must not be
	// read) names what the request asks for; two requests under one key
	// with different answers are refused as a mismatch (422). Method,
	// path, query, headers and media type count only if it puts them in.
	// It must be deterministic across processes and deploys. Set it, or
	// the options above, not both.
	FingerprintFunc func(r *http.Request, body []byte) []byte

	// MaxRequestBody bounds the body read to fingerprint it. A larger body
	// is refused with 413 before anything runs or is stored. The body is
	// buffered as it arrives, never reserved ahead from the
	// Content-Length a client announces. Defaults to 1 MiB.
	MaxRequestBody int64

	// MaxResponseBody bounds the response buffered until the commit and
	// stored for replays. A handler writing more gets ErrResponseTooLarge
	// from Write; its work is rolled back, the key released and the client
	// answered 500 (problem response-too-large). Protection is never
	// silently dropped: the response is neither sent unstored nor stored
	// truncated. Defaults to 1 MiB.
	MaxResponseBody int64

	// MaxStoredErrorBody bounds the body stored for an error answer (4xx
	// or 5xx), which a caller may make as large as it likes (an error that
	// quotes the request), and which would otherwise be kept whole for the
	// retention. The first answer is sent whole; a larger error body is
	// stored as the problem error-body-not-stored with the same status, so
	// that a replay says what happened rather than send a truncated body
	// as if it were the original: the key stays complete and the
	// operation is never run again. Defaults to 8 KiB; set it to
	// MaxResponseBody to store error bodies whole.
	MaxStoredErrorBody int64

	// ReplayHeaders are response headers stored and replayed besides
	// DefaultReplayHeaders. Set-Cookie, Date and hop-by-hop headers are
	// refused by NewMiddleware. Defaults to none.
	ReplayHeaders []string

	// UnstoredStatuses are the statuses of answers that say the endpoint
	// did not execute the request: such an answer is sent but not stored,
	// its business writes are rolled back and the key released, as when
	// the handler calls idem.NotExecuted. Defaults, when nil, to
	// DefaultUnstoredStatuses (307, 308, 404, 405, 429); an empty non-nil
	// slice stores every status.
	UnstoredStatuses []int

	// ReleaseOn5xx releases the key when the handler answers 5xx, so that a
	// retry runs again; the 5xx itself is sent but not stored. Defaults to
	// false: the 5xx is stored and replayed, its business writes rolled
	// back (idem.RollbackWrites), as Stripe does; a handler that
	// failed in a way a retry may fix should then answer 503 through a
	// middleware in front, or set this.
	ReleaseOn5xx bool

	// CancelOnDisconnect cancels the handler's context when its client
	// goes away (the request's context ends), as net/http does without
	// the middleware. Defaults to false: the handler runs on, on a context
	// that keeps the request's values but not its cancellation; its answer
	// is stored and the client's retry gets it (409 while it still runs),
	// the way Stripe behaves, since a retry of an operation cut short could
	// otherwise run it twice (a payment charged twice). Its context still
	// ends when its lease is lost and when ShutdownContext ends; bound its
	// work with its own timeouts.
	//
	// Setting it has a cost: on a transactional store, a disconnect rolls
	// the handler's writes back and releases the key, so the retry runs it
	// again, while the effects it made outside the database (a call to a
	// payment provider) stand; on a store without transactions the engine
	// completes the answer the handler returned anyway, since nothing can
	// be undone there.
	CancelOnDisconnect bool

	// ShutdownContext, when it ends, ends the context of every handler
	// running on after its client went away, as a connection closed by
	// http.Server.Close ends the others. http.Server.Shutdown waits for
	// such a handler as for any other (its connection stays active until
	// it returns); give this field the context you cancel when the server
	// must stop at once: typically the one you return from
	// http.Server.BaseContext and cancel when Shutdown's grace period is
	// over. Defaults to nil: such a handler then ends when it returns,
	// when its lease is lost, or with the process (its key is then taken
	// over once its lease has run out).
	ShutdownContext context.Context

	// WaitInFlight is how long a request whose key is in flight, for the
	// same request, waits for that execution's answer before it gets 409:
	// when the execution completes, the waiting request gets its answer
	// replayed (Idempotent-Replayed: true); when it fails and releases the
	// key, the waiting request is answered as a retry would be then (one
	// of the waiting requests runs, the others wait for it in turn). A
	// waiting request whose client goes away stops waiting. The store
	// wakes the waiters when it can (idem.Watcher: idempg across
	// processes, idemmem, idemsql within the process); otherwise, and
	// behind it, the engine reads the record a few times a second, once
	// for every waiter of a key. Defaults to 0: 409 at once. Keep it under
	// the timeouts of the server (http.Server.WriteTimeout) and of the
	// clients.
	WaitInFlight time.Duration

	// RetryAfter is the delay a 409 in-flight and a 503 advise before the
	// retry (Retry-After, rounded up to whole seconds, at least 1).
	// Defaults to 1s.
	RetryAfter time.Duration

	// Mode says what is stored. Defaults to idem.ModeResponse. In
	// idem.ModeReference a 2xx or 3xx response stores only its status and
	// the reference the handler gave to SetReference; in idem.ModeMarker
	// only its status. Replays of those go through ReplayFunc. Other
	// statuses, and a reference-mode response the handler gave no
	// reference for, are stored whole, since nothing could rebuild them.
	Mode idem.StorageMode

	// ReplayFunc rebuilds the answer of a replay stored in
	// idem.ModeReference or idem.ModeMarker, from res.Status and
	// res.Reference. The middleware has already set Idempotency-Key and
	// Idempotent-Replayed, and r.Body reads the request body again.
	// Required for those modes.
	ReplayFunc func(w http.ResponseWriter, r *http.Request, res idem.Result)

	// OnReplay is called for every replay, before it is sent, with the
	// stored result: to count or log replays, or to add headers that
	// concern this answer rather than the stored one (a trace id). It
	// cannot change the answer: the headers it puts in h are added to the
	// replay only under names the replay does not set itself, and never
	// the key and replay headers or those of the connection and the
	// framing (Content-Length, Transfer-Encoding, hop-by-hop fields).
	// r's body has been read; res is read-only. A panic in it is logged
	// and the replay sent without its headers. Defaults to nil.
	OnReplay func(r *http.Request, res idem.Result, h http.Header)

	// Logger receives handler panics, store failures, lost leases,
	// invalid tenants and oversized or incomplete responses. Defaults to
	// slog.Default().
	Logger *slog.Logger

	// RouteFunc names the route of a request for the engine's tracer
	// (idemfront.RequestTracer): a pattern such as "/orders/{id}", never the
	// raw path, whose values would make one metric series per resource.
	// Set it for a router other than net/http's ServeMux (with chi:
	// chi.RouteContext(r.Context()).RoutePattern()). Defaults to the
	// pattern ServeMux matched (Request.Pattern, without its method),
	// inside a mux's route or around a whole *http.ServeMux (which is
	// then asked for the pattern before it runs, so that replays and
	// 409s are named too); "" is reported as "unmatched". A RouteFunc
	// is called before the handler runs and, when it answered "", again
	// after: a router that sets its pattern as it runs names only the
	// requests whose handler ran, unless the middleware sits inside its
	// route.
	RouteFunc func(r *http.Request) string
}

// errNoTenantRule is New's answer to a Config that says nothing of
// tenants.
var errNoTenantRule = errors.New("idemhttp: Config.TenantFunc is nil: every caller would share one key space, " +
	"so a caller who sends another's key and body would get the other's answer replayed; " +
	"set TenantFunc to read the authenticated caller from the request, " +
	"or set SharedKeySpace: true if the API has a single caller or its keys are unguessable")

// validate checks c and fills in its defaults.
func (c *Config) validate() error {
	switch {
	case c.TenantFunc == nil && !c.SharedKeySpace:
		return errNoTenantRule
	case c.TenantFunc != nil && c.SharedKeySpace:
		return errors.New("idemhttp: Config.TenantFunc and Config.SharedKeySpace are both set; keep one")
	}
	if len(c.Methods) == 0 {
		c.Methods = DefaultMethods
	}
	if c.MaxRequestBody <= 0 {
		c.MaxRequestBody = DefaultMaxRequestBody
	}
	if c.MaxResponseBody <= 0 {
		c.MaxResponseBody = DefaultMaxResponseBody
	}
	if c.MaxStoredErrorBody <= 0 {
		c.MaxStoredErrorBody = DefaultMaxStoredErrorBody
	}
	// One byte past a limit tells "at it" from "over it": math.MaxInt64,
	// a natural "no limit", must not overflow there.
	c.MaxRequestBody = min(c.MaxRequestBody, math.MaxInt64-1)
	c.MaxResponseBody = min(c.MaxResponseBody, math.MaxInt64-1)
	if c.WaitInFlight < 0 {
		return fmt.Errorf("idemhttp: Config.WaitInFlight must not be negative, got %s", c.WaitInFlight)
	}
	if c.UnstoredStatuses == nil {
		c.UnstoredStatuses = DefaultUnstoredStatuses
	}
	for _, s := range c.UnstoredStatuses {
		if s < 200 || s > 999 {
			return fmt.Errorf("idemhttp: UnstoredStatuses: %d is not a final status", s)
		}
	}
	switch c.Mode {
	case idem.ModeResponse:
	case idem.ModeReference, idem.ModeMarker:
		if c.ReplayFunc == nil {
			return fmt.Errorf("idemhttp: Config.ReplayFunc is required in mode %s", c.Mode)
		}
	default:
		return fmt.Errorf("idemhttp: unknown storage mode %d", c.Mode)
	}
	for _, name := range c.ReplayHeaders {
		if !idemfront.ValidHeaderName(name) {
			return fmt.Errorf("idemhttp: ReplayHeaders: %q is not a header name", name)
		}
		if slices.ContainsFunc(neverReplayed, func(n string) bool { return strings.EqualFold(n, name) }) {
			return fmt.Errorf("idemhttp: header %s can never be replayed", name)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c.validateFingerprint()
}
