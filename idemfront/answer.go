package idemfront

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
)

// DefaultRetryAfter is Config.RetryAfter's default.
const DefaultRetryAfter = time.Second

// ErrResponseTooLarge is the error a front end's handler returns to the
// engine (and a response writer to the handler) when the answer is larger
// than the front end stores: Classify answers it ResponseTooLarge. The
// engine then releases the key and rolls the handler's writes back where
// the store can, so that the operation is never left unprotected: an
// answer is neither sent unstored nor stored truncated.
var ErrResponseTooLarge = errors.New("idem: response larger than the limit")

// Config configures a Front. The zero value of every field means its
// documented default.
type Config struct {
	// RetryAfter is the delay advised to a caller that met an execution in
	// flight, or a store that failed (Answer.RetryAfter): HTTP
	// Retry-After, gRPC RetryInfo. Defaults to 1s.
	RetryAfter time.Duration
}

// Front classifies the outcomes of one engine's calls for a front end.
// Build it once with New, beside the front end's own configuration; it is
// safe for concurrent use.
type Front struct {
	retryAfter    time.Duration
	transactional bool
}

// NewFront returns the kit for a front end over engine. A nil config means
// every default.
func NewFront(engine *idem.Engine, config *Config) (*Front, error) {
	if engine == nil {
		return nil, errors.New("idemfront: NewFront needs an engine")
	}
	f := &Front{retryAfter: DefaultRetryAfter, transactional: engine.Store().Info().Transactional}
	if config != nil && config.RetryAfter > 0 {
		f.retryAfter = config.RetryAfter
	}
	return f, nil
}

// RetryAfter returns the delay advised to a caller asked to retry later.
func (f *Front) RetryAfter() time.Duration { return f.retryAfter }

// Transactional reports whether the engine's store rolls a handler's
// writes back (idem.StoreInfo.Transactional): whether an answer after the
// handler ran may say its work was undone.
func (f *Front) Transactional() bool { return f.transactional }

// Retry is the advice that goes with an answer: what a caller should do
// to get the operation's answer.
type Retry uint8

// The retry advice. The zero value, for an answer that is the operation's
// own (executed or replayed), advises nothing.
const (
	// DontRetry: retrying unchanged gets the same answer (a malformed
	// key, a request or answer over the limits, a server bug).
	DontRetry Retry = iota + 1
	// RetryNow: retry with the same key; it runs again, or gets the
	// answer of the execution that took the key over.
	RetryNow
	// RetryLater: retry with the same key after Answer.RetryAfter (or, on
	// a store without transactions after a handler that did not finish,
	// once its lease ends).
	RetryLater
	// NewKey: the key names another request; a new operation needs a new
	// key.
	NewKey
)

// State is what a front end knows of a call when Engine.Do returned an
// error.
type State struct {
	// Ran: the front end's function was called (the handler ran, or
	// started to).
	Ran bool
	// Ctx is the context given to Engine.Do (Detach's, unless the front
	// end cancels on disconnect).
	Ctx context.Context
	// CallerCtx is the caller's own context (the one given as
	// idem.Operation.WaitContext), which ends when the caller goes away.
	// Nil: the same as Ctx.
	CallerCtx context.Context
}

// Answer is what a front end answers: its kind, what became of the work,
// and the retry advice.
type Answer struct {
	Kind Kind
	// Ran: the handler ran before the failure.
	Ran bool
	// Undone: what the handler wrote through the store's transaction was
	// rolled back (it ran, on a transactional store). When Ran and not
	// Undone, its effects stand: say so, a caller deciding whether to
	// retry must not be told its work was undone.
	Undone bool
	// Retry is the advice; RetryAfter the delay it comes with, set for
	// RetryLater.
	Retry      Retry
	RetryAfter time.Duration
	// Err is the error the answer stands for, nil for an answer that is
	// no failure.
	Err error
}

// Classify says how a front end answers err, the error Engine.Do
// returned. Errors of the front end's own (a response it could not
// record) are answered by the front end before it calls Classify;
// ErrResponseTooLarge is known here. An error the engine does not name
// is Internal.
func (f *Front) Classify(err error, s State) Answer {
	a := Answer{Ran: s.Ran, Undone: s.Ran && f.transactional, Err: err}
	caller := s.CallerCtx
	if caller == nil {
		caller = s.Ctx
	}
	var panicErr *idem.PanicError
	switch {
	case err == nil:
		a.Kind, a.Ran, a.Undone = Internal, false, false
		a.Err = errors.New("idemfront: Classify called without an error")
	case errors.As(err, &panicErr):
		a.Kind = Panicked
		if a.Undone {
			a.Retry = RetryNow
		} else {
			// What it did stands: the key is held until its lease ends.
			a.Retry = RetryLater
		}
	case errors.Is(err, idem.ErrFingerprintMismatch):
		a.Kind, a.Retry = Mismatch, NewKey
	case errors.Is(err, idem.ErrInFlight):
		a.Kind, a.Retry = InFlight, RetryLater
	case errors.Is(err, idem.ErrLeaseLost):
		a.Kind, a.Retry = LeaseLost, RetryNow
	case errors.Is(err, ErrResponseTooLarge):
		a.Kind, a.Retry = ResponseTooLarge, DontRetry
	case s.Ctx != nil && s.Ctx.Err() != nil && !(s.Ran && errors.Is(err, idem.ErrStore)):
		// Checked before the store: a cancelled claim also fails as a
		// store error, but the store is not to blame. Once the handler
		// ran, a store error is the store's, and says what became of the
		// work.
		a.Kind, a.Retry = Cancelled, RetryNow
	case !s.Ran && caller != nil && caller.Err() != nil && errors.Is(err, caller.Err()):
		// A call that waited for the execution in flight, and whose
		// caller went away meanwhile.
		a.Kind, a.Retry = Cancelled, RetryNow
	case errors.Is(err, idem.ErrStore):
		a.Kind, a.Retry = StoreUnavailable, RetryLater
	case errors.Is(err, idem.ErrInvalidKey):
		a.Kind, a.Retry = InvalidKey, DontRetry
	case errors.Is(err, idem.ErrStepNotSaved):
		// The step's effect stands without its record: the key is held
		// until its lease ends, then a retry takes it over.
		a.Kind, a.Retry, a.Undone = StepNotSaved, RetryLater, false
	case errors.Is(err, idem.ErrClosed):
		a.Kind, a.Retry = Closed, RetryLater
	case errors.Is(err, idem.ErrOutcomeUnknown):
		// The handler said its effects may have happened (idem.OutcomeUnknown):
		// its writes are rolled back, but what it did elsewhere may stand,
		// and the key is held until its lease ends. A front end with words
		// of its own for it (idemproxy's 502 and 504) answers it first.
		a.Kind, a.Retry, a.Undone = Internal, RetryLater, false
	case errors.Is(err, idem.ErrWritesAborted):
		a.Kind, a.Retry = Internal, RetryNow
	default:
		a.Kind, a.Retry = Internal, RetryNow
	}
	if a.Retry == RetryLater {
		a.RetryAfter = f.retryAfter
	}
	return a
}

// KindOf says how a front end answers a successful Engine.Do: Replayed
// (send the stored result with the front end's replay marker), NotStored
// (the handler said it did not execute: send its answer, nothing was
// stored) or Executed.
func KindOf(out idem.Outcome) Kind {
	switch {
	case out.Replayed:
		return Replayed
	case out.NotStored:
		return NotStored
	}
	return Executed
}

// Refuse returns the answer to a call the front end refuses before the
// engine sees it (KeyRequired, InvalidKey, InvalidTenant,
// Unauthenticated, RequestTooLarge, RequestUnreadable), with the advice
// that kind deserves. err says why, for the log (it may be nil).
func (f *Front) Refuse(kind Kind, err error) Answer {
	a := Answer{Kind: kind, Err: err}
	switch kind {
	case RequestUnreadable, Unauthenticated:
		a.Retry = RetryNow
	case Closed, InFlight, StoreUnavailable:
		a.Retry, a.RetryAfter = RetryLater, f.retryAfter
	default:
		a.Retry = DontRetry
	}
	return a
}

// Log writes what an answer deserves to tell the server's operators, on
// logger, each message prefixed with front (the front end's package name)
// and carrying the key, then attrs. Answers that say nothing the caller
// was not told (a replay, a 409, a mismatch) log nothing.
//
// Never pass tenant or key text into an error a tracer exports: the
// messages here carry the key as an attribute only, which the key rules
// (visible ASCII) make safe to print.
func (a Answer) Log(ctx context.Context, logger *slog.Logger, front, key string, attrs ...slog.Attr) {
	if logger == nil {
		return
	}
	level, msg := slog.LevelError, ""
	all := append([]slog.Attr{slog.String("key", key)}, attrs...)
	switch a.Kind {
	case Panicked:
		msg = "handler panicked"
		var p *idem.PanicError
		if errors.As(a.Err, &p) {
			all = append(all, slog.Any("panic", p.Value), slog.String("stack", string(p.Stack)))
		}
	case LeaseLost:
		level, msg = slog.LevelWarn, "lease lost to a takeover; answer discarded"
	case ResponseTooLarge:
		msg = "response larger than its limit; discarded and key released"
	case StoreUnavailable:
		level, msg = slog.LevelWarn, "store failed; request not completed"
		all = append(all, slog.Bool("handler_ran", a.Ran), slog.Any("error", a.Err))
	case StepNotSaved:
		msg = "a step ran but its result was not recorded; answer discarded, key held until its lease ends"
		all = append(all, slog.Any("error", a.Err))
	case InvalidTenant:
		msg = "the tenant rule returned a tenant that cannot be used; request refused"
		all = append(all, slog.Any("error", a.Err))
	case Closed:
		level, msg = slog.LevelWarn, "the engine is closed; request refused"
	case Internal:
		if errors.Is(a.Err, idem.ErrWritesAborted) {
			msg = "the handler answered a success after a failed SQL statement aborted its transaction; answer discarded, key released"
		} else {
			msg = "unexpected engine error"
			all = append(all, slog.Any("error", a.Err))
		}
	default:
		return
	}
	logger.LogAttrs(ctx, level, front+": "+msg, all...)
}
