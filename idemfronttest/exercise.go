package idemfronttest

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

// Harness is what a front end gives the suite: a way to serve a handler
// over an engine, and to call it.
type Harness interface {
	// Serve starts the front end over engine, protecting handler, as opts
	// says, and returns its client. It stops what it started when t ends
	// (t.Cleanup); the suite closes the engine after that.
	//
	// The front end takes each call's tenant from what the client sent
	// (Call.Tenant, through whatever carries the caller's identity in its
	// protocol: a header its tenant rule reads, metadata), and runs the
	// handler on the context the engine gives it, through which the
	// handler reaches the store's transaction.
	Serve(t *testing.T, engine *idem.Engine, opts Options, handler Handler) Client
}

// Client calls a front end served by Harness.Serve.
type Client interface {
	// Send makes one call and reads its answer back. It returns an error
	// when no answer came: the connection was lost, or ctx ended (the
	// caller went away, as the Disconnect cases do on purpose). When ctx
	// ends before the answer, Send returns only once the front end has
	// seen its caller go (over a network: the server's own context of the
	// call has ended), so that the case knows the handler has had every
	// chance to be cancelled.
	Send(ctx context.Context, call Call) (Reply, error)
}

// Options are what the suite asks of the front end for one case.
type Options struct {
	// WaitInFlight is the front end's wait mode (idem.Operation.WaitInFlight):
	// how long a duplicate waits for the execution in flight. Zero
	// answers in flight at once.
	WaitInFlight time.Duration
	// MaxRequestBody and MaxResponseBody are the front end's limits, in
	// bytes; zero means its defaults.
	MaxRequestBody  int64
	MaxResponseBody int64
}

// Handler is the protected operation, in neutral terms: the front end
// adapts it to its own handler shape (an http.Handler, a gRPC method),
// hands it the request body, and answers with what it returns. ctx is the
// handler's context (the request's, in the front end's protocol).
type Handler func(ctx context.Context, body []byte) Response

// Response is a handler's answer.
type Response struct {
	// Body is the answer's body, sent and stored byte for byte.
	Body []byte
	// Rejected makes the answer the front end's deterministic refusal
	// (HTTP 400, gRPC INVALID_ARGUMENT): stored and replayed like any
	// answer, as the operation's result.
	Rejected bool
	// Transient makes the answer a failure that says the operation did
	// not execute and may work later (HTTP 429, gRPC UNAVAILABLE): sent,
	// never stored, the key released, the handler's writes rolled back.
	Transient bool
}

// Call is one call the suite makes.
type Call struct {
	// Tenant names the caller, for the front end's tenant rule. It may
	// hold bytes no valid tenant holds (the Tenants cases send invalid
	// UTF-8 and control characters): carry it so that they reach the rule
	// (escaped in a header, for instance).
	Tenant string
	// Key is the idempotency key, sent as it is, even when malformed.
	Key string
	// Body is the request body.
	Body []byte
}

// Reply is the front end's answer, read back in the kit's words.
type Reply struct {
	// Kind is what the answer says: idemfront.Executed for a fresh answer
	// of the handler, idemfront.Replayed for one carrying the front end's
	// replay marker, or the kind of the front end's own answer (InFlight,
	// Mismatch, StoreUnavailable, InvalidKey, …). Read it from the
	// answer alone, never from what the harness knows happened: the
	// suite checks that the front end says the right thing.
	Kind idemfront.Kind
	// Body, Rejected and Transient are the handler's answer, for Executed
	// and Replayed.
	Body      []byte
	Rejected  bool
	Transient bool
	// RetryAfter is the delay the answer advises before a retry (HTTP
	// Retry-After, gRPC RetryInfo), zero when it advises none.
	RetryAfter time.Duration
}

// Features says what a front end cannot do; the cases that need it are
// skipped with a logged reason.
type Features struct {
	// NoRetryAfter: the front end's retry-later answers carry no delay.
	NoRetryAfter bool
	// NoRequestLimit, NoResponseLimit: the front end does not bound the
	// request, or the buffered answer, with Options' limits.
	NoRequestLimit  bool
	NoResponseLimit bool
	// NoWait: the front end has no wait mode (Options.WaitInFlight).
	NoWait bool
	// NoDisconnect: a caller cannot go away in the middle of a call (the
	// Client cannot end one once sent).
	NoDisconnect bool
	// NoGoexit: a handler ending its goroutine (runtime.Goexit) takes the
	// front end down with it, so the case cannot run.
	NoGoexit bool
}

// Store is the store of one case, with what the Transactions cases need
// of a transactional one.
type Store struct {
	// Store is the store under the engine.
	Store idem.Store
	// BusinessWrite inserts one business row tagged id through the
	// transaction ctx carries (the handler's context). Needed when Store
	// is transactional (idem.StoreInfo.Transactional); nil otherwise.
	BusinessWrite func(ctx context.Context, id string) error
	// BusinessCount counts the committed business rows tagged id.
	BusinessCount func(ctx context.Context, id string) (int, error)
}

// Exercise runs the whole suite against the front end h serves, each
// area as a subtest. newStore returns the store of one case; nil gives
// each case an idemmem store of its own. Every case works under tenants
// of its own, so stores may share one database.
func Exercise(t *testing.T, h Harness, features Features, newStore func(t *testing.T) *Store) {
	t.Helper()
	s := &suite{h: h, f: features, newStore: newStore}
	t.Run("Duplicates", s.duplicates)
	t.Run("Replay", s.replay)
	t.Run("InFlight", s.inFlight)
	t.Run("Mismatch", s.mismatch)
	t.Run("StoreDown", s.storeDown)
	t.Run("Tenants", s.tenants)
	t.Run("Keys", s.keys)
	t.Run("Limits", s.limits)
	t.Run("Failures", s.failures)
	t.Run("Transactions", s.transactions)
	t.Run("Wait", s.wait)
	t.Run("Disconnect", s.disconnect)
}
