package idemfront

// Kind is an answer a front end gives to a call, in no protocol's words.
// Each front end maps every Kind to one answer of its own (idemhttp: a
// status and a problem; gRPC: a status code and its details).
type Kind uint8

// The kinds of answer. The comments say what the caller is told; the
// retry advice that goes with each is in [Answer].
const (
	// Executed: the handler ran and its answer was stored and sent.
	Executed Kind = iota + 1
	// Replayed: a stored answer was sent, marked as a replay; nothing ran.
	Replayed
	// Passthrough: the call carried no key and none is required: the
	// handler ran unprotected.
	Passthrough
	// InFlight: another execution of the same request holds the key.
	// Nothing ran; retry with the same key later (the front end's "retry
	// later": HTTP 409 with Retry-After, gRPC UNAVAILABLE with RetryInfo).
	InFlight
	// Mismatch: the key was used for another request. Nothing ran; the
	// caller must use a new key for a new operation.
	Mismatch
	// LeaseLost: the handler ran past its lease and another execution took
	// the key over; this execution's answer was discarded.
	LeaseLost
	// StoreUnavailable: the store failed. If the handler had not run, it
	// did not run (idem fails closed).
	StoreUnavailable
	// StepNotSaved: a step (idem.Step) ran and its result was not
	// recorded: the answer is discarded and the key held until its lease
	// ends, so that a retry does not repeat the step at once.
	StepNotSaved
	// KeyRequired: no key where the front end requires one.
	KeyRequired
	// InvalidKey: a malformed key.
	InvalidKey
	// InvalidTenant: the tenant rule returned a tenant that cannot be
	// used (see ValidateTenant). A bug of the server, not of the caller:
	// nothing ran, and retrying does not help.
	InvalidTenant
	// Unauthenticated: the tenant could not be named.
	Unauthenticated
	// RequestTooLarge: the request is over the front end's limit. Nothing
	// ran or was stored.
	RequestTooLarge
	// RequestUnreadable: the request could not be read whole. Nothing ran.
	RequestUnreadable
	// ResponseTooLarge: the answer was too large to store: discarded, the
	// key released, the handler's writes rolled back where the store can.
	ResponseTooLarge
	// Panicked: the handler panicked.
	Panicked
	// Cancelled: the call's context ended (the caller went away under a
	// cancel-on-disconnect rule, or the server is stopping), or a caller
	// waiting for an execution in flight went away.
	Cancelled
	// ReplayFailed: a stored answer could not be rebuilt.
	ReplayFailed
	// NotStored: the handler said it did not execute (idem.NotExecuted, or
	// an answer the front end never stores): sent, not stored, the key
	// released.
	NotStored
	// Released: the handler failed in a way a retry may fix, and the front
	// end released the key for it (idemhttp's ReleaseOn5xx): sent, not
	// stored.
	Released
	// Incomplete: the handler's answer was broken (shorter than it
	// declared): sent as it was, not stored, the key released.
	Incomplete
	// Closed: the engine is closed (the server is stopping). Nothing ran.
	Closed
	// Internal: any other failure of the idempotency layer (a success
	// answered after a failed SQL statement, an unexpected engine error).
	Internal

	numKinds = iota
)

var kindNames = [...]string{
	"unknown", "executed", "replayed", "passthrough", "in_flight", "mismatch",
	"lease_lost", "store_unavailable", "step_not_saved", "key_required", "invalid_key",
	"invalid_tenant", "unauthenticated", "request_too_large", "request_unreadable",
	"response_too_large", "panicked", "cancelled", "replay_failed", "not_stored",
	"released", "incomplete", "closed", "internal",
}

// String returns the kind's name in snake case ("in_flight").
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "unknown"
}

// Kinds returns every kind, in order.
func Kinds() []Kind {
	out := make([]Kind, 0, numKinds-1)
	for k := Executed; k < numKinds; k++ {
		out = append(out, k)
	}
	return out
}

// labels are the values observers (idemprom, idemotel) report for each
// kind. They are the names the first releases reported, kept so that
// dashboards and alerts written against them keep working: where a kind
// was split later (InvalidTenant, Closed and Internal were one outcome),
// the kinds share a label.
var labels = [...]string{
	"unknown", "executed", "replayed", "passthrough", "in_flight", "fingerprint_mismatch",
	"lease_lost", "store_unavailable", "step_not_saved", "key_required", "invalid_key",
	"internal_error", "unauthenticated", "request_too_large", "request_unreadable",
	"response_too_large", "handler_panic", "request_cancelled", "replay_failed",
	"not_executed", "released", "incomplete", "internal_error", "internal_error",
}

// Label returns the value under which observers (idemprom's outcome
// label, idemotel's idem.outcome attribute) report an answer of this
// kind, so that every front end is counted under the same names.
func (k Kind) Label() string {
	if int(k) < len(labels) {
		return labels[k]
	}
	return "unknown"
}

// Failed reports whether an answer of this kind is a failure of the
// server side (the idempotency layer, its store or the handler), which a
// span marks as an error; a refusal of the caller's request is not.
func (k Kind) Failed() bool {
	switch k {
	case LeaseLost, StoreUnavailable, ResponseTooLarge, Panicked, ReplayFailed,
		Incomplete, Internal, InvalidTenant, Closed, StepNotSaved:
		return true
	}
	return false
}
