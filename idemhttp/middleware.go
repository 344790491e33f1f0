package idemhttp

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
)

// Middleware protects handlers with idempotency keys. Build it with New;
// it is safe for concurrent use.
type Middleware struct {
	config     Config
	engine     *idem.Engine
	methods    []string
	replay     headerSet // canonical names of the headers stored
	retryAfter []string  // the Retry-After value, in whole seconds
}

// New returns a middleware for config, or an error when config is
// unusable: no Engine, a storage mode without its ReplayFunc, or a
// ReplayHeaders entry that must never be replayed.
func New(config Config) (*Middleware, error) {
	if err := config.validate(); err != nil {
		return nil, err
	}
	m := &Middleware{
		config:  config,
		engine:  config.Engine,
		methods: config.Methods,
	}
	for _, name := range DefaultReplayHeaders {
		m.replay.add(http.CanonicalHeaderKey(name))
	}
	for _, name := range config.ReplayHeaders {
		m.replay.add(http.CanonicalHeaderKey(name))
	}
	m.retryAfter = []string{strconv.Itoa(retryAfterSeconds(config.Engine.Config().RetryAfter))}
	return m, nil
}

// headerSet is a set of header names, filed by length: a lookup compares
// the one or two names of the same length, which costs less than hashing
// the name for a map, on every header of every response.
type headerSet struct {
	byLen [32][]string
	long  map[string]bool // names too long for byLen
}

func (s *headerSet) add(name string) {
	if s.has(name) {
		return
	}
	if len(name) < len(s.byLen) {
		s.byLen[len(name)] = append(s.byLen[len(name)], name)
		return
	}
	if s.long == nil {
		s.long = make(map[string]bool)
	}
	s.long[name] = true
}

func (s *headerSet) has(name string) bool {
	if len(name) >= len(s.byLen) {
		return s.long[name]
	}
	for _, n := range s.byLen[len(name)] {
		if n == name {
			return true
		}
	}
	return false
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
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
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

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if !m.covers(r.Method) {
		next.ServeHTTP(w, r)
		return
	}
	key, err := ParseKey(r.Header)
	if err != nil {
		// Echoed too (SPEC: every answer to a request that carried a
		// key), so that the client can tell which of its keys was refused.
		w.Header()[HeaderKey] = r.Header[HeaderKey]
		writeProblem(w, problemInvalidKey)
		return
	}
	if key == "" {
		if m.config.RequireKey {
			writeProblem(w, problemKeyRequired)
			return
		}
		next.ServeHTTP(w, r)
		return
	}
	// From here on every answer echoes the key, as the client sent it.
	w.Header()[HeaderKey] = r.Header[HeaderKey]

	tenant := ""
	if m.config.TenantFunc != nil {
		if tenant, err = m.config.TenantFunc(r); err != nil {
			writeProblem(w, problemUnauthenticated)
			return
		}
	}
	body, err := readBody(r, m.config.MaxRequestBody)
	if err != nil {
		if errors.Is(err, errRequestTooLarge) {
			writeProblem(w, problemRequestTooLarge)
		} else {
			writeProblem(w, problemRequestUnreadable)
		}
		return
	}
	defer body.free()

	op := idem.Operation{
		Tenant:      tenant,
		Key:         key,
		Fingerprint: fingerprint(body.fingerprint[:0], r, body.bytes(), m.config.FingerprintHeaders),
	}
	ctx := r.Context()
	if m.config.FinishAfterDisconnect {
		ctx = context.WithoutCancel(ctx)
		r = r.WithContext(ctx)
	}
	run := execution{m: m, w: w, r: r, body: body, next: next}
	out, err := m.engine.Do(ctx, op, run.do)
	if run.rec != nil {
		defer run.rec.free()
	}
	switch {
	case err == nil && out.Replayed:
		m.writeReplay(w, r, body, out.Result)
	case err == nil:
		run.rec.deliver(out.Result.Status, run.rec.body)
	default:
		m.writeError(w, r, run.rec, op, err)
	}
}

// execution is one run of the handler under the engine.
type execution struct {
	m    *Middleware
	w    http.ResponseWriter
	r    *http.Request
	body *requestBody
	next http.Handler
	rec  *recorder // set when the handler runs; replays need none
}

// errReleased5xx makes the engine release the key after a 5xx when
// Config.ReleaseOn5xx is set; the recorded 5xx is then sent unstored.
var errReleased5xx = errors.New("idemhttp: 5xx answer, key released")

// do runs the handler on a request that carries ctx: the engine's context,
// through which the handler reaches the store's transaction
// (idemsql.TxFromContext(ctx), idempg.Tx(ctx)) and sees a lost lease.
func (e *execution) do(ctx context.Context) (idem.Result, error) {
	rec := newRecorder(e.w, e.m.config.MaxResponseBody)
	e.rec = rec
	if e.m.config.Mode == idem.ModeReference {
		ctx = context.WithValue(ctx, referenceKey{}, rec)
	}
	r := e.r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		e.body.reset()
		r.Body = e.body
	}
	e.next.ServeHTTP(rec, r)

	if rec.over {
		return idem.Result{}, ErrResponseTooLarge
	}
	status := rec.finalStatus()
	if status >= 500 && e.m.config.ReleaseOn5xx {
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
	case e.m.config.Mode == idem.ModeReference && rec.refSet:
		res.Mode = idem.ModeReference
		res.Reference = rec.ref
		return res, nil
	case e.m.config.Mode == idem.ModeMarker:
		res.Mode = idem.ModeMarker
		return res, nil
	}
	res.Header = e.m.storedHeader(rec.stored, e.w.Header())
	// The body is the recorder's buffer: the store copies it (or encodes
	// it) in Complete, and the buffer lives until the response is sent.
	res.Body = rec.body
	return res, nil
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
		if !m.replay.has(k) {
			// A handler that wrote the map directly (h["ETag"]) is
			// replayed too, under the canonical name stores keep.
			if k = http.CanonicalHeaderKey(k); !m.replay.has(k) {
				continue
			}
		}
		out[k] = withoutCTL(v)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// writeReplay sends a stored result back.
func (m *Middleware) writeReplay(w http.ResponseWriter, r *http.Request, body *requestBody, res idem.Result) {
	h := w.Header()
	if res.Mode != idem.ModeResponse {
		if m.config.ReplayFunc == nil {
			m.config.Logger.ErrorContext(r.Context(), "idemhttp: stored result needs Config.ReplayFunc",
				slog.String("mode", res.Mode.String()))
			writeProblem(w, problemReplayFailed)
			return
		}
		h[HeaderReplayed] = replayedTrue
		// The original body was read to fingerprint it: give the function
		// a request whose body reads it again. A copy, not r itself, which
		// outer middlewares still hold.
		r = r.WithContext(r.Context())
		if r.Body != nil && r.Body != http.NoBody {
			body.reset()
			r.Body = body
		}
		m.callReplayFunc(w, r, res)
		return
	}
	h[HeaderReplayed] = replayedTrue
	for k, v := range res.Header {
		// Checked again on the way out: the record may have been stored
		// under another configuration, or by another program.
		if !neverReplayed[k] {
			h[k] = v
		}
	}
	w.WriteHeader(res.Status)
	if len(res.Body) > 0 {
		w.Write(res.Body) //nolint:errcheck // the client is gone
	}
}

// callReplayFunc runs Config.ReplayFunc, containing its panics: the key
// is complete, so every retry would meet the same panic and a dropped
// connection; they get 500 replay-failed instead, when nothing was sent
// yet. http.ErrAbortHandler is raised again, as net/http means it.
func (m *Middleware) callReplayFunc(w http.ResponseWriter, r *http.Request, res idem.Result) {
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
		if !tw.wrote {
			writeProblem(w, problemReplayFailed)
		}
	}()
	m.config.ReplayFunc(tw, r, res)
}

// writeTracker notes whether anything was written through it. Unwrap
// keeps http.ResponseController working through it.
type writeTracker struct {
	http.ResponseWriter
	wrote bool
}

func (t *writeTracker) WriteHeader(code int) {
	if code >= 200 {
		t.wrote = true
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *writeTracker) Write(p []byte) (int, error) {
	t.wrote = true
	return t.ResponseWriter.Write(p)
}

func (t *writeTracker) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// writeError answers a failed Engine.Do.
func (m *Middleware) writeError(w http.ResponseWriter, r *http.Request, rec *recorder, op idem.Operation, err error) {
	if rec != nil && !errors.Is(err, errReleased5xx) {
		// The handler ran but its answer is discarded: none of its
		// headers may reach the problem.
		rec.restoreHeader()
	}
	ctx := r.Context()
	log := m.config.Logger
	var panicErr *idem.PanicError
	switch {
	case errors.As(err, &panicErr):
		if panicErr.Value == http.ErrAbortHandler {
			// The engine has rolled back and released; let net/http abort
			// the response as the handler meant.
			panic(http.ErrAbortHandler)
		}
		log.ErrorContext(ctx, "idemhttp: handler panicked; rolled back and key released",
			slog.String("key", op.Key), slog.Any("panic", panicErr.Value), slog.String("stack", string(panicErr.Stack)))
		writeProblem(w, problemHandlerPanic)
	case errors.Is(err, errReleased5xx):
		rec.deliver(rec.finalStatus(), rec.body)
	case errors.Is(err, idem.ErrFingerprintMismatch):
		writeProblem(w, problemFingerprintMismatch)
	case errors.Is(err, idem.ErrInFlight):
		w.Header()["Retry-After"] = m.retryAfter
		writeProblem(w, problemInFlight)
	case errors.Is(err, idem.ErrLeaseLost):
		log.WarnContext(ctx, "idemhttp: lease lost to a takeover; work rolled back",
			slog.String("key", op.Key))
		writeProblem(w, problemLeaseLost)
	case errors.Is(err, ErrResponseTooLarge):
		log.ErrorContext(ctx, "idemhttp: response larger than MaxResponseBody; rolled back and key released",
			slog.String("key", op.Key), slog.Int64("limit", m.config.MaxResponseBody))
		writeProblem(w, problemResponseTooLarge)
	case ctx.Err() != nil:
		// Checked before the store: a cancelled claim also fails as a
		// store error, but the store is not to blame.
		writeProblem(w, problemRequestCancelled)
	case errors.Is(err, idem.ErrStore):
		log.WarnContext(ctx, "idemhttp: store failed; request not completed",
			slog.String("key", op.Key), slog.Any("error", err))
		w.Header()["Retry-After"] = m.retryAfter
		writeProblem(w, problemStoreUnavailable)
	case errors.Is(err, idem.ErrInvalidKey):
		writeProblem(w, problemInvalidKey)
	default:
		log.ErrorContext(ctx, "idemhttp: unexpected engine error", slog.String("key", op.Key), slog.Any("error", err))
		writeProblem(w, problemInternal)
	}
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
