// Package idemgrpc makes unary gRPC methods idempotent with idem: a
// server interceptor that runs each call carrying an idempotency-key
// (metadata) at most once per tenant and key, and replays its answer to
// the retries, and a client interceptor that gives each logical call one
// key, kept across retries.
//
//	in, err := idemgrpc.New(engine, &idemgrpc.Config{TenantFunc: tenantOf})
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, in.UnaryServerInterceptor()))
//
// # Answers
//
// A call without a key runs unprotected (Config.RequireKey refuses it).
// A call with one is answered:
//
//   - the first time: the handler's answer, stored when it is a response
//     message or a deterministic error status (Config.StoredCodes:
//     INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION,
//     PERMISSION_DENIED, OUT_OF_RANGE); any other status (UNAVAILABLE,
//     DEADLINE_EXCEEDED, CANCELED, RESOURCE_EXHAUSTED, ABORTED, INTERNAL,
//     UNKNOWN…) is sent, not stored, the handler's writes rolled back
//     where the store can, and the key released for a retry;
//   - again: the stored answer, with idempotent-replayed: true header
//     metadata, and the header and trailer metadata of
//     Config.ReplayMetadata;
//   - while the first runs: after waiting for its answer within the
//     caller's deadline (Config.WaitInFlight), UNAVAILABLE with a
//     google.rpc.RetryInfo and the grpc-retry-pushback-ms trailer, which
//     grpc-go's retry policy honours. Never ABORTED: gRPC's retry design
//     (gRFC A6) cancels every hedged copy of a call once one gets a
//     fatal status, and the copy that is running is one of them;
//   - with another request under the key: FAILED_PRECONDITION with a
//     google.rpc.ErrorInfo (reason IDEMPOTENCY_KEY_REUSED);
//   - a malformed key (or two): INVALID_ARGUMENT; no tenant:
//     UNAUTHENTICATED; the store down: UNAVAILABLE, the handler not run.
//
// Every answer of the interceptor's own carries an ErrorInfo of domain
// ErrorDomain, so that a client tells it from the handler's.
//
// # Fingerprint
//
// The fingerprint is the full method name and a canonical walk of the
// request message (idemrpc.Fingerprint), not its wire bytes: protobuf's
// serialization is not canonical, and a retry sent by a client built
// from another revision of the schema (unknown fields, another field
// order) must not be "another request".
//
// # What passes through
//
// Streaming RPCs pass through: a stream has no one answer to store (no
// stream interceptor is offered). Methods whose idempotency_level is
// NO_SIDE_EFFECTS in the protobuf registry are reads and pass through
// too; Config.Methods chooses otherwise.
//
// # The handler's transaction
//
// The handler runs under the engine, on a context its caller's going
// away does not cancel, and reaches the store's transaction through it
// exactly as over HTTP: idemsql.TxFromContext(ctx), idempg.TxFromContext(ctx).
//
// # The client
//
// UnaryClientInterceptor adds one key per logical call. grpc-go's own
// retries and hedged copies (its service config's retryPolicy) resend
// the same metadata, so they keep the key. A retrying interceptor
// (go-grpc-middleware's retry) must come after it in the chain, so that
// each attempt reuses the key the outer call got:
//
//	grpc.WithChainUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil), retry.UnaryClientInterceptor())
//
// In the other order every attempt gets a key of its own, and the
// server runs each one.
//
// # grpc-gateway
//
// grpc-gateway forwards only some HTTP headers as metadata; pass
// GatewayHeaderMatcher to runtime.WithIncomingHeaderMatcher so that an
// Idempotency-Key header reaches the interceptor.
package idemgrpc
