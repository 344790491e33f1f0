package idemhttp

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

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
