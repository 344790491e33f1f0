// Package idemconnect makes unary Connect (connectrpc.com/connect)
// procedures idempotent with idem: a connect.Interceptor that runs each
// call carrying an Idempotency-Key header (idempotency-key metadata over
// the gRPC and gRPC-Web protocols) at most once per tenant and key, and
// replays its answer to the retries.
//
//	path, handler := demov1connect.NewOrderServiceHandler(svc, connect.WithInterceptors(idemconnect.NewInterceptor(engine, &idemconnect.Config{TenantFunc: tenantOf})))
//
// It answers as idemgrpc does (see there, and idemgrpc/idemrpc), in
// Connect's codes, which are gRPC's: the stored response message or
// deterministic error status replayed with Idempotent-Replayed: true; in
// flight UNAVAILABLE with a google.rpc.RetryInfo detail (after waiting
// within the caller's deadline); another request under the key
// FAILED_PRECONDITION; a malformed key INVALID_ARGUMENT; no tenant
// UNAUTHENTICATED; the store down UNAVAILABLE, the handler not run.
//
// Why an interceptor and not idemhttp's middleware around the handler:
// over the gRPC and gRPC-Web protocols a call's status travels in
// trailers under HTTP 200, so an HTTP middleware would store a failed
// call as a success, and could not answer in a status the client reads.
// The interceptor sees the call's message and status whatever the
// protocol. A unary call in Connect's own protocol with JSON over
// HTTP/1.1 is a plain POST:
//
//	curl -H 'Content-Type: application/json' -H 'Idempotency-Key: k1' \
//	  -H 'Authorization: Bearer acme' -d '{"cartId":"c1","totalCents":1200}' \
//	  http://127.0.0.1:3000/idem.demo.v1.OrderService/CreateOrder
//
// The fingerprint is the procedure and a canonical walk of the request
// message, whatever its encoding (JSON or binary), so a retry sent in
// the other codec is the same request. Streaming procedures pass
// through; procedures whose idempotency_level is NO_SIDE_EFFECTS (GET
// requests, in Connect's protocol) too. The handler reaches the store's
// transaction through its context, as over HTTP.
//
// A replayed response is the stored message behind a connect.Response
// whose Msg is a wrapper of it: an interceptor placed outside this one
// that asserts the response's concrete type sees the wrapper (the
// handler's own answers are passed on as they were).
package idemconnect
