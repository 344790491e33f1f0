// Package idemfiber is idem's middleware for Fiber v3 (on fasthttp, not
// net/http): it makes the POST and PATCH requests of a fiber.App that
// carry an Idempotency-Key safe to retry, with idemhttp's contract, on
// the front-end kit (idemfront) and idemhttp's rules: the same key rules
// (idemhttp.ParseKey), the same fingerprint (idemhttp.Fingerprint: a
// service moved between net/http and Fiber keeps its keys' meaning), the
// same problem+json answers (idemhttp.ProblemFor), replays byte for byte
// marked Idempotent-Replayed: true, and the handler's database
// transaction committed with its answer.
//
//	app := fiber.New()
//	mw, err := idemfiber.New(engine, &idemfiber.Config{
//		TenantFunc: func(c fiber.Ctx) (string, error) { return fiber.Locals[string](c, "user"), nil },
//	})
//	app.Post("/orders", authenticate, mw, createOrder)
//
// # How it sits in Fiber's chain
//
// The middleware runs the rest of the chain (c.Next) inside the engine's
// execution. fasthttp buffers the whole response until the chain returns,
// so the response the handlers build (c.JSON, c.Send, c.Status, headers)
// is the answer: the middleware copies what it stores out of fasthttp's
// buffers before they are reused, and sends a replay or a problem in its
// place. An error a handler returns is rendered inside the execution by
// the app's ErrorHandler (as Fiber would render it after the chain), so
// that the stored answer is the rendered error, never an empty 200.
//
// # Transactions
//
// The handler's context is c.Context() (fiber v3's user context, set
// with c.SetContext for the execution): it carries the store's
// transaction (idemsql.TxFromContext(c.Context()),
// idempg.TxFromContext(c.Context())), and ends when the lease is lost or
// Config.ShutdownContext ends.
//
// # Disconnects
//
// fasthttp tells a handler nothing of its client going away: a handler
// always runs on, its answer is stored and the client's retry gets it
// (409 in-flight while it still runs), as idemhttp does by default.
// idemhttp's CancelOnDisconnect, ReleaseOn5xx and the reference and
// marker storage modes have no counterpart here.
package idemfiber

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v3"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/idemhttp"
)

// Config configures the middleware. The zero value of every field means
// its documented default, which is idemhttp.Config's.
type Config struct {
	// Next, when it returns true, skips the middleware for the request
	// (Fiber's convention): it runs unprotected.
	Next func(c fiber.Ctx) bool

	// Methods are the request methods protected. Defaults to
	// idemhttp.DefaultMethods (POST, PATCH).
	Methods []string

	// RequireKey answers a covered request without Idempotency-Key with
	// the 400 problem key-required. Defaults to false: it passes through
	// unprotected.
	RequireKey bool

	// TenantFunc names the owner of the request's key space from what the
	// server knows of the caller (what the authentication in front left
	// in the context, fiber.Locals), never from a header the client sets
	// freely. An error answers 401 unauthenticated. Required unless
	// SharedKeySpace is set; see idemhttp.Config.TenantFunc.
	TenantFunc func(c fiber.Ctx) (string, error)

	// SharedKeySpace puts every caller in one key space; see
	// idemhttp.Config.SharedKeySpace for what it costs.
	SharedKeySpace bool

	// FingerprintHeaders are request headers that take part in the
	// fingerprint besides method, path, query, media type and body.
	FingerprintHeaders []string

	// MaxRequestBody bounds the request body (413 request-too-large
	// above it). Defaults to idemhttp.DefaultMaxRequestBody. fiber's own
	// BodyLimit (4 MiB by default) applies first.
	MaxRequestBody int64

	// MaxResponseBody bounds the answer stored: a larger one is
	// discarded, the handler's work rolled back where the store can and
	// the key released, and the client answered 500 response-too-large.
	// Defaults to idemhttp.DefaultMaxResponseBody.
	MaxResponseBody int64

	// MaxStoredErrorBody bounds the body stored for a 4xx or 5xx answer;
	// see idemhttp.Config.MaxStoredErrorBody. Defaults to
	// idemhttp.DefaultMaxStoredErrorBody.
	MaxStoredErrorBody int64

	// ReplayHeaders are response headers stored and replayed besides
	// idemhttp.DefaultReplayHeaders.
	ReplayHeaders []string

	// UnstoredStatuses are the statuses of answers sent but not stored,
	// their work rolled back and the key released. Defaults, when nil, to
	// idemhttp.DefaultUnstoredStatuses.
	UnstoredStatuses []int

	// WaitInFlight is how long a request whose key is in flight waits for
	// that execution's answer before it gets 409; see
	// idemhttp.Config.WaitInFlight. Defaults to 0.
	WaitInFlight time.Duration

	// RetryAfter is the delay a 409 in-flight and a 503 advise. Defaults
	// to 1s.
	RetryAfter time.Duration

	// ShutdownContext, when it ends, ends the context of every running
	// handler; give it the context you cancel when the server must stop
	// at once. Defaults to nil.
	ShutdownContext context.Context

	// Logger receives what operators must know (a panic, a store
	// failure). Defaults to slog.Default().
	Logger *slog.Logger
}

// Middleware is the Fiber middleware. Build it with New.
type Middleware struct {
	config  Config
	engine  *idem.Engine
	front   *idemfront.Front
	replay  *idemfront.Headers
	retry   string
	tracer  idemfront.RequestTracer
	methods []string
}

// New returns the middleware over engine, as a fiber.Handler. It refuses
// a configuration that names no tenant rule (or two), and replay headers
// that can never be replayed.
func New(engine *idem.Engine, config *Config) (fiber.Handler, error) {
	m, err := NewMiddleware(engine, config)
	if err != nil {
		return nil, err
	}
	return m.Handle, nil
}

// NewMiddleware is New, returning the Middleware itself.
func NewMiddleware(engine *idem.Engine, config *Config) (*Middleware, error) {
	if engine == nil {
		return nil, errors.New("idemfiber: New needs an engine")
	}
	var cfg Config
	if config != nil {
		cfg = *config
	}
	switch {
	case cfg.TenantFunc == nil && !cfg.SharedKeySpace:
		return nil, errors.New("idemfiber: Config.TenantFunc is nil: every caller would share one key space " +
			"(a caller who sends another's key and body would get the other's answer replayed); " +
			"set TenantFunc, or SharedKeySpace if that is meant")
	case cfg.TenantFunc != nil && cfg.SharedKeySpace:
		return nil, errors.New("idemfiber: Config.TenantFunc and Config.SharedKeySpace are both set")
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = idemhttp.DefaultMethods
	}
	if cfg.MaxRequestBody <= 0 {
		cfg.MaxRequestBody = idemhttp.DefaultMaxRequestBody
	}
	if cfg.MaxResponseBody <= 0 {
		cfg.MaxResponseBody = idemhttp.DefaultMaxResponseBody
	}
	if cfg.MaxStoredErrorBody <= 0 {
		cfg.MaxStoredErrorBody = idemhttp.DefaultMaxStoredErrorBody
	}
	if cfg.UnstoredStatuses == nil {
		cfg.UnstoredStatuses = idemhttp.DefaultUnstoredStatuses
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	front, err := idemfront.NewFront(engine, &idemfront.Config{RetryAfter: cfg.RetryAfter})
	if err != nil {
		return nil, err
	}
	replay, err := idemfront.NewHeaders(append(slices.Clip(idemhttp.DefaultReplayHeaders), cfg.ReplayHeaders...), idemhttp.NeverReplayedHeaders())
	if err != nil {
		return nil, fmt.Errorf("idemfiber: ReplayHeaders: %w", err)
	}
	m := &Middleware{
		config: cfg, engine: engine, front: front, replay: replay, methods: cfg.Methods,
		retry: strconv.Itoa(idemhttp.RetryAfterSeconds(front.RetryAfter())),
	}
	m.tracer = idemfront.RequestTracerOf(engine.Config().Tracer)
	return m, nil
}

// Handle is the fiber.Handler.
func (m *Middleware) Handle(c fiber.Ctx) error {
	if m.config.Next != nil && m.config.Next(c) {
		return c.Next()
	}
	method := c.Method()
	if !slices.Contains(m.methods, method) {
		return c.Next()
	}
	if m.tracer == nil {
		_, err := m.serve(c, c.Context(), nil)
		return err
	}
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	// Copied: fasthttp's method buffer is reused once the request ends,
	// and a tracer may keep what it is given.
	method = strings.Clone(method)
	t := &trace{ctx: m.tracer.TraceRequestStart(c.Context(), idemfront.TraceRequestStartData{Method: method, Route: route})}
	outcome := idemfront.Panicked
	defer func() {
		m.tracer.TraceRequestEnd(t.ctx, idemfront.TraceRequestEndData{
			Method: method, Route: route, Kind: outcome, Status: t.status,
			Execution: t.execution, Err: t.err,
		})
	}()
	outcome, err := m.serve(c, t.ctx, t)
	return err
}

// trace is what a traced request learns as it is served.
type trace struct {
	ctx       context.Context
	status    int
	execution time.Duration
	err       error
}

// serve protects one covered request. callerCtx is the caller's context
// (c.Context(), under the tracer's span when there is one).
func (m *Middleware) serve(c fiber.Ctx, callerCtx context.Context, t *trace) (idemfront.Kind, error) {
	req := &c.Request().Header
	keys := req.PeekAll(idemhttp.HeaderKey)
	if len(keys) == 0 {
		if m.config.RequireKey {
			return m.refuse(c, t, idemfront.KeyRequired)
		}
		if t != nil {
			t.ctx = callerCtx
		}
		return idemfront.Passthrough, c.Next()
	}
	// Copied out of fasthttp's buffers: the key outlives the request in
	// the engine's logs and in the echo below.
	echo := make([]string, len(keys))
	for i, k := range keys {
		echo[i] = string(k)
	}
	key, err := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: echo})
	m.echoKey(c, echo)
	if err != nil {
		return m.refuse(c, t, idemfront.InvalidKey)
	}

	tenant := ""
	if m.config.TenantFunc != nil {
		if tenant, err = m.config.TenantFunc(c); err != nil {
			return m.refuse(c, t, idemfront.Unauthenticated)
		}
		if err := idemfront.ValidateTenant(tenant); err != nil {
			a := m.front.Refuse(idemfront.InvalidTenant, err)
			a.Log(callerCtx, m.config.Logger, "idemfiber", key)
			return a.Kind, m.problem(c, t, a)
		}
	}

	body := c.BodyRaw()
	if int64(len(body)) > m.config.MaxRequestBody {
		return m.refuse(c, t, idemfront.RequestTooLarge)
	}
	fp, err := m.fingerprint(c, body)
	if err != nil {
		return m.refuse(c, t, idemfront.RequestUnreadable)
	}
	op := idem.Operation{
		Tenant: tenant, Key: key, Fingerprint: fp,
		WaitInFlight: m.config.WaitInFlight, WaitContext: callerCtx,
	}
	ctx, stop := idemfront.Detach(callerCtx, m.config.ShutdownContext)
	defer stop()
	x := &execution{m: m, c: c}
	returned := false
	defer func() {
		if returned {
			return
		}
		if p := recover(); p != nil {
			panic(p)
		}
		// A handler that ended its goroutine (runtime.Goexit) ends
		// fasthttp's worker with it, which would leave the connection
		// open and the client waiting for ever: close it, as net/http
		// does. The engine has rolled back and released the key.
		_ = c.RequestCtx().Conn().Close()
	}()
	out, err := m.engine.Do(ctx, op, x.run)
	returned = true
	if t != nil {
		t.err, t.execution = err, x.took
	}
	switch {
	case err == nil && out.Replayed:
		m.writeReplay(c, echo, out.Result)
		if t != nil {
			t.status = out.Result.Status
		}
		return idemfront.Replayed, nil
	case err == nil:
		// The handler's answer is in fasthttp's response: sent as it is.
		if t != nil {
			t.status = c.Response().StatusCode()
		}
		if out.NotStored {
			return idemfront.NotStored, nil
		}
		return idemfront.Executed, nil
	}
	// The handler's answer, if any, is discarded: none of it may reach
	// the problem.
	c.Response().Reset()
	m.echoKey(c, echo)
	a := m.front.Classify(err, idemfront.State{Ran: x.ran, Ctx: ctx, CallerCtx: callerCtx})
	var attrs []slog.Attr
	if a.Kind == idemfront.ResponseTooLarge {
		attrs = append(attrs, slog.Int64("limit", m.config.MaxResponseBody))
	}
	a.Log(ctx, m.config.Logger, "idemfiber", key, attrs...)
	return a.Kind, m.problem(c, t, a)
}

// echoKey echoes the caller's key fields on the answer, as idemhttp does.
func (m *Middleware) echoKey(c fiber.Ctx, keys []string) {
	h := &c.Response().Header
	h.Del(idemhttp.HeaderKey)
	for _, k := range keys {
		h.Add(idemhttp.HeaderKey, k)
	}
}

// fingerprint is idemhttp.Fingerprint of the request, rebuilt as far as
// the fingerprint reads it: method, path and query as sent, the
// fingerprinted headers and the media type.
func (m *Middleware) fingerprint(c fiber.Ctx, body []byte) ([]byte, error) {
	u, err := url.ParseRequestURI(string(c.Request().RequestURI()))
	if err != nil {
		return nil, err
	}
	h := http.Header{}
	req := &c.Request().Header
	for _, name := range append(m.config.FingerprintHeaders, "Content-Type") {
		for _, v := range req.PeekAll(name) {
			h.Add(name, string(v))
		}
	}
	r := &http.Request{Method: c.Method(), URL: u, Header: h}
	return idemhttp.Fingerprint(r, body, m.config.FingerprintHeaders), nil
}

// refuse answers a call refused before the engine saw it.
func (m *Middleware) refuse(c fiber.Ctx, t *trace, kind idemfront.Kind) (idemfront.Kind, error) {
	a := m.front.Refuse(kind, nil)
	return a.Kind, m.problem(c, t, a)
}

// problem sends idemhttp's problem for a.
func (m *Middleware) problem(c fiber.Ctx, t *trace, a idemfront.Answer) error {
	status, body := idemhttp.ProblemFor(a, m.front.Transactional())
	resp := c.Response()
	resp.Header.SetContentType(idemhttp.ContentTypeProblem)
	resp.Header.Set("X-Content-Type-Options", "nosniff")
	if a.Retry == idemfront.RetryLater {
		resp.Header.Set("Retry-After", m.retry)
	}
	resp.SetStatusCode(status)
	resp.SetBody(body)
	if t != nil {
		t.status = status
	}
	return nil
}

// writeReplay sends a stored answer in place of whatever the response
// held, marked as a replay.
func (m *Middleware) writeReplay(c fiber.Ctx, keys []string, res idem.Result) {
	resp := c.Response()
	resp.Reset()
	m.echoKey(c, keys)
	// Without it fasthttp would add a Content-Type the answer did not have.
	resp.Header.SetNoDefaultContentType(true)
	for k, vs := range res.Header {
		if !m.replay.Replayable(k) {
			continue
		}
		for _, v := range vs {
			resp.Header.Add(k, v)
		}
	}
	resp.Header.Set(idemhttp.HeaderReplayed, "true")
	resp.SetStatusCode(res.Status)
	resp.SetBody(res.Body)
}

// execution is one run of the rest of the chain under the engine.
type execution struct {
	m    *Middleware
	c    fiber.Ctx
	ran  bool
	took time.Duration
}

// run is the engine's function: it runs the rest of the chain on ctx
// (through which the handlers reach the store's transaction), then turns
// what the chain left in fasthttp's response into the result to store.
func (x *execution) run(ctx context.Context) (idem.Result, error) {
	m, c := x.m, x.c
	x.ran = true
	start := time.Now()
	defer func() { x.took = time.Since(start) }()
	outer := c.Context()
	c.SetContext(ctx)
	defer c.SetContext(outer)
	if err := c.Next(); err != nil {
		// Rendered now, as Fiber would once the chain returned: what is
		// stored is the error as the client sees it.
		if err := c.App().ErrorHandler(c, err); err != nil {
			c.Response().Reset()
			c.Response().SetStatusCode(fiber.StatusInternalServerError)
		}
	}
	resp := c.Response()
	// A streamed body (SetBodyStream) is read whole here, as fasthttp
	// would read it to send it: the retries need its bytes.
	body := resp.Body()
	if int64(len(body)) > m.config.MaxResponseBody {
		return idem.Result{}, idemhttp.ErrResponseTooLarge
	}
	status := resp.StatusCode()
	if slices.Contains(m.config.UnstoredStatuses, status) {
		idem.NotExecuted(ctx)
		return idem.Result{Mode: idem.ModeResponse, Status: status}, nil
	}
	if status >= 500 {
		// Stored and replayed, as idemhttp does, but without its writes.
		idem.RollbackWrites(ctx)
	}
	res := idem.Result{Mode: idem.ModeResponse, Status: status, Header: map[string][]string{}}
	if status >= 400 && int64(len(body)) > m.config.MaxStoredErrorBody {
		res.Header["Content-Type"] = []string{idemhttp.ContentTypeProblem}
		res.Body = idemhttp.ErrorBodyNotStored(status, len(body))
		return res, nil
	}
	// Every byte copied: fasthttp reuses these buffers for the next
	// request once this one is answered, and the store may keep what it
	// is given.
	for k, v := range resp.Header.All() {
		name := string(k)
		if m.replay.Stored(name) {
			name = http.CanonicalHeaderKey(name)
			res.Header[name] = append(res.Header[name], string(v))
		}
	}
	res.Body = bytes.Clone(body)
	return res, nil
}
