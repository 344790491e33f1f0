package idemclient

import (
	"context"
	"time"
)

// Trace records what Transport did for one request. Pass it in with
// WithTrace and read it after RoundTrip (or http.Client.Do) returns; the
// Transport writes it while the call runs, so reading it concurrently is a
// data race. When http.Client follows redirects, the Trace covers the whole
// call: History holds the attempts of every hop, in order, and Key is the
// operation's key, which 307 and 308 hops carry on (see the package
// documentation).
type Trace struct {
	// Key is the Idempotency-Key sent on every attempt of the operation:
	// the caller's own or the one Transport made. Empty when the request
	// was not covered.
	Key string

	// Attempts is the number of attempts sent, over every hop.
	Attempts int

	// Replayed is true when the final response carried
	// Idempotent-Replayed: true: the server answered from its stored
	// result and did not run the operation for this call.
	Replayed bool

	// History has one entry per attempt, in order.
	History []Attempt
}

// Attempt is one try of a request.
type Attempt struct {
	// Status is the response status, 0 when the attempt got no response.
	Status int

	// Err is the error of an attempt that got no response (a connection
	// error, or ErrAttemptTimeout).
	Err error

	// Replayed is true when the response carried Idempotent-Replayed: true.
	Replayed bool

	// Wait is the pause taken after this attempt before the next one; zero
	// for the last attempt.
	Wait time.Duration
}

type traceKey struct{}

// WithTrace returns a context carrying tr. A request made with it records
// its attempts in tr.
func WithTrace(ctx context.Context, tr *Trace) context.Context {
	return context.WithValue(ctx, traceKey{}, tr)
}

// TraceFrom returns the Trace that WithTrace put in ctx, or nil. The final
// response's Request carries the context, so TraceFrom(resp.Request.Context())
// finds it too.
func TraceFrom(ctx context.Context) *Trace {
	tr, _ := ctx.Value(traceKey{}).(*Trace)
	return tr
}
