// Package idemhttp is the net/http middleware of idem: it makes POST and
// PATCH requests that carry an Idempotency-Key safe to retry. The first
// request with a key runs the handler; every retry with the same key and
// the same request gets the first answer back, byte for byte, marked
// Idempotent-Replayed: true.
//
//	engine, _ := idem.NewEngine(store, nil)
//	mw, _ := idemhttp.New(idemhttp.Config{Engine: engine})
//	http.Handle("POST /orders", mw.Handler(createOrder))
//
// # What each situation answers
//
// The middleware implements the contract of SPEC §4:
//
//   - a method not in Config.Methods (default POST, PATCH) passes through;
//   - a request without a key passes through, or gets 400 when
//     Config.RequireKey is set;
//   - a malformed key (empty, longer than 255, not visible ASCII, a bad
//     sf-string, two fields or a comma-joined list) gets 400;
//   - a new key runs the handler and stores its answer;
//   - a completed key with the same fingerprint replays the stored status,
//     allowlisted headers and body;
//   - a key used with another request (method, path, query, body or
//     Config.FingerprintHeaders) gets 422 and nothing runs;
//   - a key whose execution is in flight gets 409 with Retry-After;
//   - an execution whose lease was taken over gets 409 and its work is
//     rolled back;
//   - a store failure gets 503 with Retry-After (fail closed);
//   - a handler panic, or a cancelled request, gets 500 after the work is
//     rolled back and the key released, so that a retry runs again. A
//     panic with http.ErrAbortHandler is re-raised once that is done.
//
// Every answer to a request that carried an Idempotency-Key echoes its
// field(s), a refused malformed key included. Every error is an RFC 9457 application/problem+json body whose
// type is one of the stable URIs listed in docs/PROBLEMS.md.
//
// # Tenants
//
// Keys live in a tenant's key space: the same key sent by two customers
// names two operations. Config.TenantFunc reads the tenant from what the
// server knows of the caller. Authentication, rate limiting and other
// gates sit in front of this middleware: what they refuse is never
// stored, and by the time TenantFunc runs the caller is known.
//
// # Transactions
//
// The handler runs under the context the engine gives it: r.Context()
// carries the store's transaction (idemsql.TxFromContext(r.Context()),
// idempg.Tx(r.Context())). Business writes made through it commit
// together with the stored answer, or not at all. The same context ends
// when the heartbeat finds the lease lost, so a handler that checks it
// stops early.
//
// A 5xx answer is stored and replayed, as Stripe does, but its business
// writes are rolled back (idem.RollbackWrites). With
// Config.ReleaseOn5xx the key is released instead and a retry runs again.
//
// # Buffering and streaming
//
// The response is buffered and sent only after the commit: an answer sent
// before could reach the client for an operation that is then rolled back.
// So the ResponseWriter a protected handler sees records Flush as a no-op
// (the response is delivered whole, after the commit), fails Hijack with
// ErrHijack (a hijacked connection cannot be stored), and stops at
// Config.MaxResponseBody with ErrResponseTooLarge. It still implements
// io.ReaderFrom, passes 103 Early Hints straight through (they announce
// resources, not a result), and unwraps for http.ResponseController, which
// reaches deadlines through it. Streaming endpoints should not be
// protected.
//
// The request body is read once, up to Config.MaxRequestBody, to
// fingerprint it, and given back to the handler from memory. The buffers
// of the body and of the response are reused by later requests, so, as
// net/http already requires, a handler must not touch its request body
// or its ResponseWriter once it has returned.
//
// A response larger than Config.MaxResponseBody cannot be stored. Rather
// than send it unprotected or store it truncated, the middleware rolls
// the work back, releases the key and answers 500 (response-too-large).
// A request body larger than Config.MaxRequestBody gets 413 before
// anything runs.
//
// # What is replayed
//
// Replays carry the status, the body and the headers that describe the
// result (DefaultReplayHeaders plus Config.ReplayHeaders), never
// Set-Cookie, Date or hop-by-hop fields. The first answer itself is sent
// whole, cookies included. In idem.ModeReference and idem.ModeMarker a
// successful answer is stored compactly and replays are rebuilt by
// Config.ReplayFunc.
package idemhttp
