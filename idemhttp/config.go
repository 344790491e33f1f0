package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"

	"github.com/idem-go/idem"
)

// Defaults for Config.
const (
	DefaultMaxRequestBody  = 1 << 20
	DefaultMaxResponseBody = 1 << 20
)

// DefaultMethods are the methods covered when Config.Methods is empty:
// the ones that are not idempotent by definition. PUT and DELETE are, and
// GET must be safe, so retrying them needs no key.
var DefaultMethods = []string{http.MethodPost, http.MethodPatch}

// DefaultReplayHeaders are the response headers stored and replayed: the
// ones that describe the result itself. Headers about the connection, the
// moment or the session (Date, Set-Cookie, hop-by-hop fields) are never
// replayed; Config.ReplayHeaders adds to this list.
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
}

// neverReplayed are the headers a replay must not carry whatever the
// configuration says: a cookie handed out again to whoever retries, a
// stale Date, fields that describe one connection, or the two headers
// the middleware sets itself.
var neverReplayed = map[string]bool{
	"Set-Cookie":          true,
	"Set-Cookie2":         true,
	"Date":                true,
	"Connection":          true,
	"Keep-Alive":          true,
	"Proxy-Connection":    true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
	"Content-Length":      true, // recomputed from the stored body
	HeaderKey:             true,
	HeaderReplayed:        true,
}

// Config configures a Middleware. Only Engine is required; the zero value
// of every other field means its documented default.
type Config struct {
	// Engine runs the operations. Required.
	Engine *idem.Engine

	// Methods are the request methods the middleware protects; others pass
	// through untouched. Defaults to DefaultMethods (POST, PATCH).
	Methods []string

	// RequireKey makes a covered request without Idempotency-Key a 400
	// problem. Defaults to false: such a request passes through
	// unprotected, as Stripe does.
	RequireKey bool

	// TenantFunc names the owner of the request's key space, from what the
	// server knows of the caller (its authenticated identity), never from
	// a header the client sets freely. An error answers 401 and nothing is
	// stored. Authentication normally sits in front of this middleware and
	// has already refused unknown callers; TenantFunc only reads what it
	// left in the request context. Defaults to one tenant, "", for all.
	TenantFunc func(r *http.Request) (string, error)

	// FingerprintHeaders are request headers that take part in the
	// fingerprint besides method, path, query and body (for example
	// Content-Type, or a header that selects an API version). Defaults to
	// none.
	FingerprintHeaders []string

	// MaxRequestBody bounds the body read to fingerprint it. A larger body
	// is refused with 413 before anything runs or is stored. Defaults to
	// 1 MiB.
	MaxRequestBody int64

	// MaxResponseBody bounds the response buffered until the commit and
	// stored for replays. A handler writing more gets ErrResponseTooLarge
	// from Write; its work is rolled back, the key released and the client
	// answered 500 (problem response-too-large). Protection is never
	// silently dropped: the response is neither sent unstored nor stored
	// truncated. Defaults to 1 MiB.
	MaxResponseBody int64

	// ReplayHeaders are response headers stored and replayed besides
	// DefaultReplayHeaders. Set-Cookie, Date and hop-by-hop headers are
	// refused by New. Defaults to none.
	ReplayHeaders []string

	// ReleaseOn5xx releases the key when the handler answers 5xx, so that a
	// retry runs again; the 5xx itself is sent but not stored. Defaults to
	// false: the 5xx is stored and replayed, its business writes rolled
	// back (idem.RollbackWrites), as Stripe does; a handler that
	// failed in a way a retry may fix should then answer 503 through a
	// middleware in front, or set this.
	ReleaseOn5xx bool

	// FinishAfterDisconnect lets an execution run to completion, and store
	// its result, when its client goes away mid-request (the request's
	// context is cancelled): the client's retry then meets it in flight
	// (409) and, once it completed, gets the replay, the way Stripe
	// behaves. The handler then runs on a context that is not cancelled
	// with the request, so bound its work with its own timeouts.
	// Defaults to false, the contract's rule: a cancelled request rolls
	// back, releases the key, and the retry runs again.
	FinishAfterDisconnect bool

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

	// Logger receives handler panics, store failures, lost leases and
	// oversized responses. Defaults to slog.Default().
	Logger *slog.Logger
}

// validate checks c and fills in its defaults.
func (c *Config) validate() error {
	if c.Engine == nil {
		return errors.New("idemhttp: Config.Engine is required")
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
	// One byte past a limit tells "at it" from "over it": math.MaxInt64,
	// a natural "no limit", must not overflow there.
	c.MaxRequestBody = min(c.MaxRequestBody, math.MaxInt64-1)
	c.MaxResponseBody = min(c.MaxResponseBody, math.MaxInt64-1)
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
		if !validToken(name) {
			return fmt.Errorf("idemhttp: ReplayHeaders: %q is not a header name", name)
		}
		if neverReplayed[http.CanonicalHeaderKey(name)] {
			return fmt.Errorf("idemhttp: header %s can never be replayed", name)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// validToken reports whether name is an HTTP field name (an RFC 9110
// token): what a store accepts in a stored header.
func validToken(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
