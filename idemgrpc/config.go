package idemgrpc

import (
	"context"
	"log/slog"
	"time"

	"github.com/idem-go/idem/idemgrpc/idemrpc"
	"google.golang.org/grpc/codes"
)

// The metadata the interceptors read and write, and the domain of the
// ErrorInfo on the interceptor's own answers (see idemrpc).
const (
	// MetadataKey carries a call's key, as the Idempotency-Key header
	// does over HTTP (gRPC metadata keys are lowercase).
	MetadataKey = idemrpc.MetadataKey
	// MetadataReplayed is header metadata set to "true" on a replay.
	MetadataReplayed = idemrpc.MetadataReplayed
	// MetadataPushback is the trailer grpc-go's retry policy reads.
	MetadataPushback = idemrpc.MetadataPushback
	// ErrorDomain is the ErrorInfo domain of the interceptor's answers.
	ErrorDomain = idemrpc.ErrorDomain
)

// DefaultStoredCodes are the handler's error statuses stored and
// replayed as the operation's answer: deterministic refusals, which a
// retry of the same request would get again. Every other status
// (UNAVAILABLE, DEADLINE_EXCEEDED, CANCELED, RESOURCE_EXHAUSTED, ABORTED,
// INTERNAL, UNKNOWN, UNAUTHENTICATED, UNIMPLEMENTED, DATA_LOSS) says the
// operation did not complete, or may complete on a retry: it is sent,
// never stored, the handler's writes are rolled back and the key
// released.
var DefaultStoredCodes = []codes.Code{
	codes.InvalidArgument, codes.NotFound, codes.AlreadyExists,
	codes.FailedPrecondition, codes.PermissionDenied, codes.OutOfRange,
}

// Defaults of Config.
const (
	// DefaultWaitInFlight bounds the wait for an execution in flight when
	// the caller set no deadline (with one, the wait ends before it).
	DefaultWaitInFlight = idemrpc.DefaultWaitInFlight
	// DefaultMaxResponseBytes bounds a stored answer.
	DefaultMaxResponseBytes = idemrpc.DefaultMaxResponseBytes
)

// Config configures the server interceptor. Only TenantFunc is required
// (or SharedKeySpace).
type Config struct {
	// TenantFunc names the caller who owns the key space, from the call's
	// context: run after authentication (put the interceptor after the
	// one that authenticates), never from something the caller sets
	// freely. An error answers UNAUTHENTICATED; nothing runs.
	TenantFunc func(ctx context.Context) (string, error)
	// SharedKeySpace: every caller shares one key space (tenant "").
	// Only for a service with one caller.
	SharedKeySpace bool

	// KeyFunc, when set, reads the key from the request instead of the
	// idempotency-key metadata (AIP-155's request_id field, say). ""
	// means no key.
	KeyFunc func(ctx context.Context, fullMethod string, req any) (string, error)
	// RequireKey answers a call without a key INVALID_ARGUMENT; by
	// default it runs unprotected.
	RequireKey bool
	// Methods, when set, says which methods are protected; by default
	// every unary method is, except those whose idempotency_level is
	// NO_SIDE_EFFECTS.
	Methods func(fullMethod string) bool

	// WaitInFlight is how long a duplicate waits for the execution in
	// flight to answer, at most: the wait also ends before the caller's
	// deadline, so that the caller gets UNAVAILABLE with RetryInfo rather
	// than DEADLINE_EXCEEDED. Zero means DefaultWaitInFlight; negative
	// answers at once.
	WaitInFlight time.Duration
	// RetryAfter is the delay advised with UNAVAILABLE (RetryInfo and the
	// grpc-retry-pushback-ms trailer). Defaults to 1s.
	RetryAfter time.Duration

	// StoredCodes are the handler's error statuses stored as the
	// operation's answer. Nil means DefaultStoredCodes; OK (a response
	// message) is always stored.
	StoredCodes []codes.Code
	// ReplayMetadata lists the header and trailer metadata of the
	// handler's answer stored and replayed with it (compared without
	// regard to case). Nothing by default: metadata about one call (a
	// trace id, a server timing) must not reach another.
	ReplayMetadata []string

	// MaxRequestBytes refuses a request message larger than this
	// (proto.Size), RESOURCE_EXHAUSTED; zero means no limit of the
	// interceptor's (grpc.MaxRecvMsgSize still applies).
	MaxRequestBytes int
	// MaxResponseBytes bounds the stored answer; a larger one is
	// discarded, the key released, RESOURCE_EXHAUSTED. Zero means
	// DefaultMaxResponseBytes.
	MaxResponseBytes int

	// Shutdown, when set, ends the handlers still running once the
	// server stops: a handler runs on a context its caller's going away
	// does not cancel (see idemfront.Detach).
	Shutdown context.Context
	// Logger receives what operators must know (a panic, a store
	// failure). Nil uses slog.Default.
	Logger *slog.Logger
}
