package idemclient

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// ClientTracer observes the attempts and retries of a Transport. Set it in
// Transport.Tracer; idemprom and idemotel provide one. It must be safe for
// concurrent use. Only covered requests (those sent with a key) are
// traced.
type ClientTracer interface {
	// TraceAttemptStart is called before each attempt. The context it
	// returns is the attempt's: the request sent carries it, so a tracer
	// may put a span there for the Base transport to propagate.
	TraceAttemptStart(ctx context.Context, data TraceAttemptStartData) context.Context
	// TraceAttemptEnd is called when the attempt has its response headers
	// or its error, with that context.
	TraceAttemptEnd(ctx context.Context, data TraceAttemptEndData)
	// TraceRetry is called when the Transport decides to send the
	// operation again, before its pause, with the request's context.
	TraceRetry(ctx context.Context, data TraceRetryData)
}

// TraceAttemptStartData describes an attempt about to be sent.
type TraceAttemptStartData struct {
	Method string
	// Resend is the number of attempts of the operation sent before this
	// one (OpenTelemetry's http.request.resend_count): 0 for the first.
	Resend int
}

// TraceAttemptEndData describes an attempt that ended.
type TraceAttemptEndData struct {
	Method  string
	Resend  int
	Outcome AttemptOutcome
	// Status is the response status, 0 without a response.
	Status   int
	Duration time.Duration
	// Err is the error of an attempt that got no response.
	Err error
}

// TraceRetryData describes a retry decided.
type TraceRetryData struct {
	// Reason is the outcome of the attempt that is retried: AttemptInFlight,
	// AttemptRateLimited, AttemptUnavailable, AttemptTimeout or AttemptError.
	Reason AttemptOutcome
	// Wait is the pause before the next attempt.
	Wait time.Duration
	// Resend is the Resend of the next attempt.
	Resend int
}

// AttemptOutcome is how an attempt ended.
type AttemptOutcome uint8

// The outcomes of an attempt. Their String values are the label values
// idemprom and idemotel report.
const (
	// AttemptResponse: a response that is neither a replay nor one of the
	// retried statuses below (a 201, a 422, …).
	AttemptResponse AttemptOutcome = iota + 1
	// AttemptReplayed: a response carrying Idempotent-Replayed: true.
	AttemptReplayed
	// AttemptInFlight: 409, another execution holds the key.
	AttemptInFlight
	// AttemptRateLimited: 429.
	AttemptRateLimited
	// AttemptUnavailable: 502, 503 or 504.
	AttemptUnavailable
	// AttemptTimeout: no response headers within AttemptTimeout.
	AttemptTimeout
	// AttemptError: no response (a connection error).
	AttemptError
	// AttemptCancelled: the request's context ended.
	AttemptCancelled
)

var attemptOutcomeNames = [...]string{"unknown", "response", "replayed", "in_flight", "rate_limited", "unavailable", "timeout", "error", "cancelled"}

// String returns "response", "replayed", "in_flight", "rate_limited",
// "unavailable", "timeout", "error" or "cancelled".
func (o AttemptOutcome) String() string {
	if int(o) < len(attemptOutcomeNames) {
		return attemptOutcomeNames[o]
	}
	return "unknown"
}

// AttemptOutcomes returns every attempt outcome.
func AttemptOutcomes() []AttemptOutcome {
	out := make([]AttemptOutcome, 0, len(attemptOutcomeNames)-1)
	for o := AttemptResponse; o <= AttemptCancelled; o++ {
		out = append(out, o)
	}
	return out
}

// attemptOutcome names the outcome of an attempt.
func attemptOutcome(ctx context.Context, resp *http.Response, err error) AttemptOutcome {
	switch {
	case err != nil && ctx.Err() != nil:
		return AttemptCancelled
	case errors.Is(err, ErrAttemptTimeout):
		return AttemptTimeout
	case err != nil:
		return AttemptError
	case isReplay(resp):
		return AttemptReplayed
	}
	switch resp.StatusCode {
	case http.StatusConflict:
		return AttemptInFlight
	case http.StatusTooManyRequests:
		return AttemptRateLimited
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return AttemptUnavailable
	}
	return AttemptResponse
}
