// Package idemhttptest runs the front-end conformance suite
// (idemfronttest) against idemhttp, or against a front end that answers
// as idemhttp does (an adapter to a router built on net/http, a proxy),
// over a real HTTP server on loopback:
//
//	func TestConformance(t *testing.T) {
//		idemfronttest.Exercise(t, idemhttptest.Harness{}, idemfronttest.Features{}, nil)
//	}
//
// Decode reads an answer of idemhttp back in the kit's words, for a
// harness of its own.
package idemhttptest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemfronttest"
	"github.com/idem-go/idem/idemhttp"
)

// Harness is idemfronttest.Harness for idemhttp.
type Harness struct {
	// Config is the middleware's base configuration. Serve sets
	// TenantFunc (the tenant the suite's call names), WaitInFlight and
	// the limits from the suite's Options, and Logger to one that
	// discards when it is nil.
	Config idemhttp.Config
	// Server, when set, builds the server's handler from the
	// configuration and the protected handler, for a front end built on
	// idemhttp (a router's adapter). Nil serves
	// NewMiddleware(engine, cfg).Handler(protected).
	Server func(t *testing.T, engine *idem.Engine, cfg *idemhttp.Config, protected http.Handler) http.Handler
}

// The statuses the protected handler answers the suite's Responses with:
// 201 for an answer, 400 for a refusal (stored, as every 4xx), 429 for a
// transient failure (in idemhttp.DefaultUnstoredStatuses: never stored).
const (
	statusAnswer    = http.StatusCreated
	statusRejected  = http.StatusBadRequest
	statusTransient = http.StatusTooManyRequests
)

// headerTenant carries the suite's tenant, percent-encoded so that any
// byte reaches the tenant rule; headerCall names a call, so that Send
// knows when the server saw it end.
const (
	headerTenant = "X-Idemfronttest-Tenant"
	headerCall   = "X-Idemfronttest-Call"
)

// Serve implements idemfronttest.Harness.
func (h Harness) Serve(t *testing.T, engine *idem.Engine, opts idemfronttest.Options, handler idemfronttest.Handler) idemfronttest.Client {
	t.Helper()
	cfg := h.Config
	cfg.TenantFunc = func(r *http.Request) (string, error) {
		v, ok := r.Header[headerTenant]
		if !ok {
			return "", errors.New("idemhttptest: no tenant")
		}
		return url.PathUnescape(v[0])
	}
	cfg.SharedKeySpace = false
	cfg.WaitInFlight = opts.WaitInFlight
	if opts.MaxRequestBody > 0 {
		cfg.MaxRequestBody = opts.MaxRequestBody
	}
	if opts.MaxResponseBody > 0 {
		cfg.MaxResponseBody = opts.MaxResponseBody
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	protected := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		resp := handler(r.Context(), body)
		status := statusAnswer
		switch {
		case resp.Transient:
			status = statusTransient
		case resp.Rejected:
			status = statusRejected
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(status)
		w.Write(resp.Body) //nolint:errcheck // recorded by the middleware
	})
	var served http.Handler
	if h.Server != nil {
		served = h.Server(t, engine, &cfg, protected)
	} else {
		m, err := idemhttp.NewMiddleware(engine, &cfg)
		if err != nil {
			t.Fatal(err)
		}
		served = m.Handler(protected)
	}
	c := &client{ended: map[string]chan struct{}{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ch := c.endedChan(r.Header.Get(headerCall)); ch != nil {
			context.AfterFunc(r.Context(), func() { close(ch) })
		}
		served.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	c.srv = srv
	return c
}

type client struct {
	srv   *httptest.Server
	next  atomic.Int64
	mu    sync.Mutex
	ended map[string]chan struct{} // closed when the server's context of the call ends
}

func (c *client) endedChan(id string) chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ended[id]
}

// Send implements idemfronttest.Client.
func (c *client) Send(ctx context.Context, call idemfronttest.Call) (idemfronttest.Reply, error) {
	id := strconv.FormatInt(c.next.Add(1), 10)
	ended := make(chan struct{})
	c.mu.Lock()
	c.ended[id] = ended
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.ended, id)
		c.mu.Unlock()
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.srv.URL+"/orders", bytes.NewReader(call.Body))
	if err != nil {
		return idemfronttest.Reply{}, err
	}
	req.Header.Set(headerTenant, url.PathEscape(call.Tenant))
	req.Header.Set(headerCall, id)
	if call.Key != "" {
		req.Header.Set(idemhttp.HeaderKey, call.Key)
	}
	resp, err := c.srv.Client().Do(req)
	if err == nil {
		var body []byte
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			return Decode(resp, body), nil
		}
	}
	if ctx.Err() != nil {
		// The caller left: return once the server has seen it go.
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
		}
	}
	return idemfronttest.Reply{}, err
}

// kinds are the answers of idemhttp's problems, by slug.
var kinds = map[string]idemfront.Kind{
	"key-required":         idemfront.KeyRequired,
	"invalid-key":          idemfront.InvalidKey,
	"unauthenticated":      idemfront.Unauthenticated,
	"request-too-large":    idemfront.RequestTooLarge,
	"request-unreadable":   idemfront.RequestUnreadable,
	"fingerprint-mismatch": idemfront.Mismatch,
	"in-flight":            idemfront.InFlight,
	"internal-error":       idemfront.Internal,
	"replay-failed":        idemfront.ReplayFailed,
	"store-unavailable":    idemfront.StoreUnavailable,
	"request-cancelled":    idemfront.Cancelled,
	"lease-lost":           idemfront.LeaseLost,
	"handler-panic":        idemfront.Panicked,
	"response-too-large":   idemfront.ResponseTooLarge,
}

// Decode reads an answer of idemhttp back as a Reply: a problem of the
// middleware's own by its slug; otherwise the handler's answer, replayed
// when it carries Idempotent-Replayed: true, a refusal when its status is
// 400 and transient when it is 429 (the statuses Harness's handler
// answers with).
func Decode(resp *http.Response, body []byte) idemfronttest.Reply {
	r := idemfronttest.Reply{}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
		r.RetryAfter = time.Duration(s) * time.Second
	}
	if resp.Header.Get(idemhttp.HeaderReplayed) == "true" {
		r.Kind = idemfront.Replayed
	} else if strings.HasPrefix(resp.Header.Get("Content-Type"), idemhttp.ContentTypeProblem) {
		var p struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(body, &p) == nil {
			if k, ok := kinds[strings.TrimPrefix(p.Type, idemhttp.ProblemTypeBase)]; ok {
				r.Kind = k
				return r
			}
		}
		r.Kind = idemfront.Internal
		r.Body = body
		return r
	} else {
		r.Kind = idemfront.Executed
	}
	r.Body = body
	r.Rejected = resp.StatusCode == statusRejected
	r.Transient = resp.StatusCode == statusTransient
	if resp.StatusCode != statusAnswer && !r.Rejected && !r.Transient {
		// Not an answer the handler gives: say so in the body the suite
		// prints.
		r.Body = fmt.Appendf(nil, "unexpected status %d: %s", resp.StatusCode, body)
	}
	return r
}
