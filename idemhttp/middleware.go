package idemhttp

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
	"github.com/idem-go/idem/internal/fieldtext"
)

// Middleware protects handlers with idempotency keys. Build it with NewMiddleware;
// it is safe for concurrent use.
type Middleware struct {
	config     Config
	engine     *idem.Engine
	front      *idemfront.Front // the answers to the engine's errors
	methods    []string
	replay     *idemfront.Headers      // the headers stored and replayed
	retryAfter []string                // the Retry-After value, in whole seconds
	problems   *problems               // the texts true for the engine's store
	tracer     idemfront.RequestTracer // the engine's tracer, when it traces requests

	keyHeader     string        // the canonical name of the key field
	canonicalJSON bool          // Config.CanonicalJSON or Config.IgnoreJSON
	ignoreJSON    *JSONPointers // Config.IgnoreJSON, compiled
	keyRequired   *problem      // the key problems, worded for the key source
	invalidKey    *problem
}

// NewMiddleware returns a middleware that runs the requests it covers
// through engine, or an error when config is unusable: no tenant rule
// (neither TenantFunc nor SharedKeySpace), a storage mode without its
// ReplayFunc, or a ReplayHeaders entry that must never be replayed. A nil
// config is an error too, since a tenant rule is required.
func NewMiddleware(engine *idem.Engine, config *Config) (*Middleware, error) {
	if engine == nil {
		return nil, errors.New("idemhttp: NewMiddleware needs an engine")
	}
	if config == nil {
		return nil, errNoTenantRule
	}
	cfg := *config
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	keyHeader, err := cfg.validateKeySource()
	if err != nil {
		return nil, err
	}
	ignoreJSON, err := ParseJSONPointers(cfg.IgnoreJSON...)
	if err != nil {
		return nil, err
	}

	front, err := idemfront.NewFront(engine, &idemfront.Config{RetryAfter: cfg.RetryAfter})
	if err != nil {
		return nil, err
	}
	// validate has refused what NewHeaders would.
	// A key field of another name is never replayed either.
	replay, err := idemfront.NewHeaders(append(slices.Clip(DefaultReplayHeaders), cfg.ReplayHeaders...), append(slices.Clip(neverReplayed), keyHeader))
	if err != nil {
		return nil, fmt.Errorf("idemhttp: ReplayHeaders: %w", err)
	}
	m := &Middleware{
		config:   cfg,
		engine:   engine,
		front:    front,
		methods:  cfg.Methods,
		replay:   replay,
		problems: &problemsNotTransactional,

		keyHeader:     keyHeader,
		canonicalJSON: cfg.CanonicalJSON || len(cfg.IgnoreJSON) > 0,
		ignoreJSON:    ignoreJSON,
	}
	if front.Transactional() {
		m.problems = &problemsTransactional
	}
	m.keyRequired, m.invalidKey = keyProblems(keyHeader, cfg.KeyFunc != nil)
	m.retryAfter = []string{strconv.Itoa(retryAfterSeconds(front.RetryAfter()))}
	m.tracer = idemfront.RequestTracerOf(engine.Config().Tracer)
	return m, nil
}

// retryAfterSeconds rounds d up to whole seconds, at least 1: Retry-After
// has no finer unit, and 0 would invite an immediate retry storm.
func retryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Handler wraps next. See the package documentation for what each
// situation answers.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	// Around a whole ServeMux, the mux names the route before it runs:
	// a request answered without running it (a replay, a 409, a 422)
	// is then traced under its route too.
	mux, _ := next.(*http.ServeMux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !m.covers(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		if m.tracer != nil {
			m.serveTraced(w, r, next, mux)
			return
		}
		m.serve(w, r, next, nil)
	})
}

func (m *Middleware) covers(method string) bool {
	for _, c := range m.methods {
		if c == method {
			return true
		}
	}
	return false
}

// serve answers a request of a covered method, and says how. t is the
// request's trace, nil when untraced.
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, t *requestTrace) (idemfront.Kind, int) {
	key, err := m.keyOf(r)
	if err != nil {
		// Echoed too, as every answer to a covered request that carried a
		// key, so that the client can tell which of its keys was refused.
		m.echoKey(w, r)
		return idemfront.InvalidKey, writeProblem(w, m.invalidKey)
	}
	if key == "" {
		if m.config.RequireKey {
			return idemfront.KeyRequired, writeProblem(w, m.keyRequired)
		}
		next.ServeHTTP(w, r)
		if t != nil {
			t.pattern = r.Pattern
		}
		return idemfront.Passthrough, 0
	}
	// From here on every answer echoes the key, as the client sent it.
	m.echoKey(w, r)

	tenant := ""
	if m.config.TenantFunc != nil {
		if tenant, err = m.config.TenantFunc(r); err != nil {
			return idemfront.Unauthenticated, writeProblem(w, problemUnauthenticated)
		}
		if err := idemfront.ValidateTenant(tenant); err != nil {
			// Not UTF-8, or a control character (which names the key
			// spaces idem keeps for itself): a server bug, not the
			// caller's, and no store outage either.
			m.config.Logger.ErrorContext(r.Context(), "idemhttp: Config.TenantFunc returned a tenant that cannot be used; request refused",
				slog.String("tenant", fieldtext.Escape(tenant)), slog.String("key", key), slog.Any("error", err))
			return idemfront.Internal, writeProblem(w, problemInternal)
		}
	}

	x := &exchange{m: m, w: w, r: r, next: next, scratch: scratches.Get().(*scratch)}
	defer x.end()
	buf, err := readBody(r, m.config.MaxRequestBody, x.scratch.req)
	x.body.set(buf)
	if err != nil {
		if errors.Is(err, errRequestTooLarge) {
			return idemfront.RequestTooLarge, writeProblem(w, problemRequestTooLarge)
		}
		return idemfront.RequestUnreadable, writeProblem(w, problemRequestUnreadable)
	}

	var fp []byte
	fp, x.scratch.canon = m.fingerprintOf(x.fp[:0], r, buf, x.scratch.canon)
	op := idem.Operation{
		Tenant:       tenant,
		Key:          key,
		Fingerprint:  fp,
		WaitInFlight: m.config.WaitInFlight,
		// A waiting request stops when its client goes away, whatever
		// CancelOnDisconnect says: it has run nothing.
		WaitContext: r.Context(),
	}
	x.ctx = r.Context()
	if t != nil {
		x.ctx, x.timed = t.ctx, true
	}
	if !m.config.CancelOnDisconnect {
		var stop func()
		x.ctx, stop = idemfront.Detach(x.ctx, m.config.ShutdownContext)
		defer stop()
	}
	out, err := m.engine.Do(x.ctx, op, x.do)
	if t != nil {
		t.err = err
		if x.ran {
			t.execution = monotonic() - x.started
			t.pattern = x.pattern
		}
	}
	switch {
	case err == nil && out.Replayed:
		return m.writeReplay(w, r, &x.body, out.Result)
	case err == nil:
		status := x.rec.finalStatus()
		x.rec.deliver(status, x.rec.body)
		if out.NotStored {
			return idemfront.NotStored, status
		}
		return idemfront.Executed, status
	}
	return m.writeError(x, op, err)
}

// exchange is one protected request. What it hands the handler (the
// recorder as its ResponseWriter, the body as its Request.Body) is
// allocated with it and never reused: a handler, or a goroutine it
// started, may still hold those once the request has ended, and they then
// refuse service. The buffers behind them, which only the middleware
// touches once the handler has returned, come from a pool.
type exchange struct {
	m       *Middleware
	w       http.ResponseWriter
	r       *http.Request
	next    http.Handler
	ctx     context.Context // what Engine.Do was given
	body    requestBody
	rec     recorder
	ran     bool          // the handler was called
	timed   bool          // traced: started and pattern are wanted
	started time.Duration // when the handler was called (monotonic()), if timed
	pattern string        // the pattern a ServeMux behind set on the handler's request, if timed
	fp      [sha256.Size]byte
	scratch *scratch
}

// scratch holds the buffers an exchange borrows.
type scratch struct {
	req    []byte
	resp   []byte
	outer  []headerField
	stored map[string][]string
	canon  []byte // the canonical form of a JSON body (Config.CanonicalJSON)
}

var scratches = sync.Pool{New: func() any {
	return &scratch{outer: make([]headerField, 0, 4), stored: make(map[string][]string, 4)}
}}

// end gives the buffers back once the answer has been sent. The handler
// has returned (the engine does not return before), so the recorder is
// sealed; the body may still be read by what the handler left behind:
// its buffer is kept out of the pool while a WriteTo writes from it.
func (x *exchange) end() {
	s := x.scratch
	x.scratch = nil
	s.req = x.body.end()
	if cap(s.req) > maxPooledBody {
		s.req = nil
	}
	if cap(s.canon) > maxPooledBody {
		s.canon = nil
	}
	if x.ran {
		x.rec.seal()
		s.resp = x.rec.body[:0]
		if cap(s.resp) > maxPooledBody {
			s.resp = nil
		}
		clear(x.rec.outer) // drop the references: the pool must not keep them alive
		s.outer = x.rec.outer[:0]
	}
	// Deleted one by one: clear reseeds the map's hash, which costs more
	// than the few entries it holds.
	for k := range s.stored {
		delete(s.stored, k)
	}
	scratches.Put(s)
}

// errReleased5xx makes the engine release the key after a 5xx when
// Config.ReleaseOn5xx is set; the recorded 5xx is then sent unstored.
var errReleased5xx = errors.New("idemhttp: 5xx answer, key released")

// errShortBody makes the engine drop an answer whose body is shorter than
// the Content-Length its handler declared.
var errShortBody = errors.New("idemhttp: the handler wrote less than the Content-Length it declared")

// do runs the handler on a request that carries ctx: the engine's context,
// through which the handler reaches the store's transaction
// (idemsql.TxFromContext(ctx), idempg.TxFromContext(ctx)) and sees a lost lease.
func (x *exchange) do(ctx context.Context) (idem.Result, error) {
	m := x.m
	rec := &x.rec
	rec.start(x.w, m.config.MaxResponseBody, x.scratch.resp, x.scratch.outer)
	x.ran = true
	if x.timed {
		x.started = monotonic()
	}
	if m.config.Mode == idem.ModeReference {
		ctx = context.WithValue(ctx, referenceKey{}, rec)
	}
	r := x.r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &x.body
	}
	// Sealed however the handler ends: a panic and runtime.Goexit too.
	defer rec.seal()
	if x.timed {
		// Deferred: a handler that panics was routed too.
		defer func() { x.pattern = r.Pattern }()
	}
	x.next.ServeHTTP(rec, r)
	rec.seal()

	if rec.over {
		return idem.Result{}, ErrResponseTooLarge
	}
	if rec.short() {
		return idem.Result{}, errShortBody
	}
	status := rec.finalStatus()
	if slices.Contains(m.config.UnstoredStatuses, status) {
		// The endpoint says it did not execute: send, store nothing.
		idem.NotExecuted(ctx)
		return idem.Result{Mode: idem.ModeResponse, Status: status}, nil
	}
	if status >= 500 && m.config.ReleaseOn5xx {
		return idem.Result{}, errReleased5xx
	}
	if status >= 500 {
		// Stored and replayed, as Stripe does, but without its writes.
		idem.RollbackWrites(ctx)
	}
	res := idem.Result{Mode: idem.ModeResponse, Status: status}
	switch {
	case status >= 400:
		// Errors are stored whole in every mode: there is no resource to
		// rebuild them from.
		if int64(len(rec.body)) > m.config.MaxStoredErrorBody {
			res.Header = m.storedErrorHeader(x.scratch.stored, x.w.Header())
			res.Body = errorBodyNotStored(status, len(rec.body))
			return res, nil
		}
	case m.config.Mode == idem.ModeReference && rec.refSet:
		res.Mode = idem.ModeReference
		res.Reference = rec.ref
		return res, nil
	case m.config.Mode == idem.ModeMarker:
		res.Mode = idem.ModeMarker
		return res, nil
	}
	res.Header = m.storedHeader(x.scratch.stored, x.w.Header())
	// The body is the recorder's buffer: the store copies it (or encodes
	// it) in Complete, and the buffer lives until the response is sent.
	res.Body = rec.body
	return res, nil
}

// representation are the replayed headers that describe the body itself:
// wrong for the problem stored in place of an error body too large.
var representation = map[string]bool{
	"Content-Disposition": true,
	"Content-Encoding":    true,
	"Content-Language":    true,
	"Content-Location":    true,
	"Content-Type":        true,
	"Etag":                true,
	"Last-Modified":       true,
}

// storedErrorHeader is storedHeader for the problem stored in place of an
// error body too large: its own Content-Type, and none of the headers
// that described the original body.
func (m *Middleware) storedErrorHeader(out map[string][]string, h http.Header) map[string][]string {
	m.storedHeader(out, h)
	for k := range out {
		if representation[k] {
			delete(out, k)
		}
	}
	out["Content-Type"] = contentTypeProblem
	out["X-Content-Type-Options"] = nosniff
	return out
}

// storedHeader fills out with the allowlisted part of h and returns it,
// or nil when there is none. The value slices are shared with h: stores
// copy or encode them.
//
// A value holding a control character (a handler's bug) is stored with
// each one as a space, as net/http sends CR and LF: a store refuses
// control characters, and refusing the whole answer would undo the work
// the handler already did (all of it, with a store that has no
// transaction) for a retry to run again.
func (m *Middleware) storedHeader(out map[string][]string, h http.Header) map[string][]string {
	for k, v := range h {
		if !m.replay.Stored(k) {
			continue
		}
		// A handler that wrote the map directly (h["ETag"]) is replayed
		// too, under the canonical name.
		out[http.CanonicalHeaderKey(k)] = withoutCTL(v)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// writeReplay sends a stored result back, and says how.
func (m *Middleware) writeReplay(w http.ResponseWriter, r *http.Request, body *requestBody, res idem.Result) (idemfront.Kind, int) {
	h := w.Header()
	if res.Mode != idem.ModeResponse {
		if m.config.ReplayFunc == nil {
			m.config.Logger.ErrorContext(r.Context(), "idemhttp: stored result needs Config.ReplayFunc",
				slog.String("mode", res.Mode.String()))
			return idemfront.ReplayFailed, writeProblem(w, problemReplayFailed)
		}
		h[HeaderReplayed] = replayedTrue
		m.onReplay(w, r, res)
		// The original body was read to fingerprint it: give the function
		// a request whose body reads it again. A copy, not r itself, which
		// outer middlewares still hold.
		r = r.WithContext(r.Context())
		if r.Body != nil && r.Body != http.NoBody {
			body.rewind()
			r.Body = body
		}
		return m.callReplayFunc(w, r, res)
	}
	h[HeaderReplayed] = replayedTrue
	for k, v := range res.Header {
		// Checked again on the way out: the record may have been stored
		// under another configuration, or by another program (a front
		// end that keeps lowercase names, as gRPC metadata is).
		if m.replay.Replayable(k) {
			h[http.CanonicalHeaderKey(k)] = v
		}
	}
	m.onReplay(w, r, res)
	w.WriteHeader(res.Status)
	if len(res.Body) > 0 {
		w.Write(res.Body) //nolint:errcheck // the client is gone
	}
	return idemfront.Replayed, res.Status
}

// callReplayFunc runs Config.ReplayFunc, containing its panics: the key
// is complete, so every retry would meet the same panic and a dropped
// connection; they get 500 replay-failed instead, when nothing was sent
// yet. http.ErrAbortHandler is raised again, as net/http means it.
func (m *Middleware) callReplayFunc(w http.ResponseWriter, r *http.Request, res idem.Result) (outcome idemfront.Kind, status int) {
	tw := &writeTracker{ResponseWriter: w}
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v == http.ErrAbortHandler {
			panic(v)
		}
		m.config.Logger.ErrorContext(r.Context(), "idemhttp: Config.ReplayFunc panicked",
			slog.Any("panic", v), slog.String("stack", string(debug.Stack())))
		outcome, status = idemfront.ReplayFailed, tw.status
		if !tw.wrote {
			status = writeProblem(w, problemReplayFailed)
		}
	}()
	m.config.ReplayFunc(tw, r, res)
	if tw.status == 0 {
		tw.status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	return idemfront.Replayed, tw.status
}

// writeTracker notes whether anything was written through it. Unwrap
// keeps http.ResponseController working through it.
type writeTracker struct {
	http.ResponseWriter
	wrote  bool
	status int // the final status sent, 0 before
}

func (t *writeTracker) WriteHeader(code int) {
	if code >= 200 && !t.wrote {
		t.wrote, t.status = true, code
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *writeTracker) Write(p []byte) (int, error) {
	if !t.wrote {
		t.wrote, t.status = true, http.StatusOK
	}
	return t.ResponseWriter.Write(p)
}

func (t *writeTracker) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// writeError answers a failed Engine.Do, and says how: the errors of the
// middleware's own first, then the engine's, by the kind idemfront gives
// them.
func (m *Middleware) writeError(x *exchange, op idem.Operation, err error) (idemfront.Kind, int) {
	w := x.w
	var rec *recorder
	if x.ran {
		rec = &x.rec
	}
	if rec != nil && !errors.Is(err, errReleased5xx) && !errors.Is(err, errShortBody) {
		// The handler ran but its answer is discarded: none of its
		// headers may reach the problem.
		rec.restoreHeader()
	}
	ctx := x.ctx
	log := m.config.Logger
	switch {
	case errors.Is(err, errReleased5xx):
		status := rec.finalStatus()
		rec.deliver(status, rec.body)
		return idemfront.Released, status
	case errors.Is(err, errShortBody):
		// What net/http would have sent: the declared Content-Length and
		// the bytes written, on a connection it then closes, so that the
		// client sees a broken response and retries. Nothing is stored:
		// a replay could only repeat the breakage, or pass a truncated
		// body off as whole.
		log.ErrorContext(ctx, "idemhttp: the handler wrote less than the Content-Length it declared; answer sent as net/http sends it, not stored, key released",
			slog.String("key", op.Key), slog.Int64("declared", rec.declLen), slog.Int("written", len(rec.body)))
		status := rec.finalStatus()
		rec.deliver(status, rec.body)
		return idemfront.Incomplete, status
	}
	var panicErr *idem.PanicError
	if errors.As(err, &panicErr) && panicErr.Value == http.ErrAbortHandler {
		// The engine has rolled back and released; let net/http abort
		// the response as the handler meant.
		panic(http.ErrAbortHandler)
	}
	a := m.front.Classify(err, idemfront.State{Ran: x.ran, Ctx: ctx, CallerCtx: x.r.Context()})
	var attrs []slog.Attr
	if a.Kind == idemfront.ResponseTooLarge {
		attrs = append(attrs, slog.Int64("limit", m.config.MaxResponseBody))
	}
	a.Log(ctx, log, "idemhttp", op.Key, attrs...)
	if a.Kind == idemfront.InFlight || a.Kind == idemfront.StoreUnavailable || a.Kind == idemfront.StepNotSaved {
		w.Header()["Retry-After"] = m.retryAfter
	}
	return a.Kind, writeProblem(w, m.problemFor(a))
}

// problemFor returns the problem that answers a: the texts that say what
// became of the work follow whether the handler ran and the store.
func (m *Middleware) problemFor(a idemfront.Answer) *problem {
	p := m.problems
	switch a.Kind {
	case idemfront.Panicked:
		return p.handlerPanic
	case idemfront.Mismatch:
		return problemFingerprintMismatch
	case idemfront.InFlight:
		return problemInFlight
	case idemfront.LeaseLost:
		return p.leaseLost
	case idemfront.ResponseTooLarge:
		return p.responseTooLarge
	case idemfront.Cancelled:
		if a.Ran {
			return p.requestCancelledRan
		}
		return p.requestCancelled
	case idemfront.StoreUnavailable:
		if a.Ran {
			return p.storeUnavailableRan
		}
		return p.storeUnavailable
	case idemfront.InvalidKey:
		return m.invalidKey
	case idemfront.StepNotSaved:
		// A step's effect stands without its record: the key is held
		// until its lease ends, then a retry takes it over.
		return p.storeUnavailableRan
	}
	// Internal and Closed: a success answered after a failed SQL
	// statement, a closed engine, an error nobody expected.
	return problemInternal
}

// withoutCTL returns values with every control character but tab as a
// space; values itself when there is none, which is the rule.
func withoutCTL(values []string) []string {
	for i, v := range values {
		if fieldtext.Clean(v) {
			continue
		}
		clean := slices.Clone(values)
		for j := i; j < len(clean); j++ {
			clean[j] = fieldtext.Spaced(clean[j])
		}
		return clean
	}
	return values
}
