package idemhttp

import (
	"context"
	"crypto/sha256"
	"errors"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/fieldtext"
)

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
