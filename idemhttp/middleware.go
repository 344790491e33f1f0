package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
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
