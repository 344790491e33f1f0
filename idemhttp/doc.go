// Package idemhttp is the net/http middleware of idem: it makes POST and
// PATCH requests that carry an Idempotency-Key safe to retry. The first
// request with a key runs the handler; every retry with the same key and
// the same request gets the first answer back, byte for byte, marked
// Idempotent-Replayed: true.
//
//	engine, _ := idem.NewEngine(store, nil)
//	mw, _ := idemhttp.NewMiddleware(engine, &idemhttp.Config{
//		TenantFunc: func(r *http.Request) (string, error) { return userID(r.Context()) },
//	})
//	http.Handle("POST /orders", authenticate(mw.Handler(createOrder)))
//
// # What each situation answers
//
// The middleware implements the protocol described in docs/PROTOCOL.md:
//
//   - a method not in Config.Methods (default POST, PATCH) passes through
//     untouched, without the Idempotency-Key echo, key or no key;
//   - a request without a key passes through, or gets 400 when
//     Config.RequireKey is set;
//   - a malformed key (empty, longer than 255, not visible ASCII, a bad
//     sf-string, two fields or a comma-joined list) gets 400;
//   - a new key runs the handler and stores its answer;
//   - a completed key with the same fingerprint replays the stored status,
//     allowlisted headers and body;
//   - a key used with another request (method, path, query, media type,
//     body or Config.FingerprintHeaders) gets 422 and nothing runs;
//   - a key whose execution is in flight gets 409 with Retry-After, or,
//     with Config.WaitInFlight, waits up to that long for the execution
//     to end and then gets its answer replayed;
//   - an execution whose lease was taken over gets 409 and its answer is
//     discarded (its work rolled back on a transactional store);
//   - a store failure gets 503 with Retry-After (fail closed);
//   - a handler panic gets 500; on a transactional store its work is
//     rolled back and the key released, so that a retry runs again; on a
//     store without transactions its key stays in flight until its lease
//     ends. A panic with http.ErrAbortHandler is re-raised once that is
//     done.
//
// Every answer to a covered request that carried an Idempotency-Key echoes
// its field(s), a refused malformed key included. Every error is an RFC
// 9457 application/problem+json body whose type is one of the stable URIs
// listed in docs/PROBLEMS.md; its detail says what became of the work on
// the store in use.
//
// # Answers that are not results
//
// An answer that says the endpoint did not execute the request is sent
// but not stored; its business writes are rolled back and the key is
// released, so that a corrected retry runs. A handler says so with
// idem.NotExecuted(r.Context()) (it refused the request before any work).
// The statuses in Config.UnstoredStatuses say so too: by default what a
// router answers for a path or method it does not serve (404, 405), its
// redirects to another URL (307, 308), and 429 (a limit reached
// downstream, which replaying for a day would only prolong). 301, 302 and
// 303 are results: a POST that answers 303 See Other after creating a
// resource did execute.
//
// # Tenants
//
// Keys live in a tenant's key space: the same key sent by two customers
// names two operations. Config.TenantFunc reads the tenant from what the
// server knows of the caller. Without it every caller shares one key
// space, and any caller who guesses a key can get another's answer
// replayed: New refuses that unless Config.SharedKeySpace says it is
// meant. Authentication, rate limiting and other gates sit in front of
// this middleware: what they refuse is never stored, and by the time
// TenantFunc runs the caller is known.
//
// # What the store holds, and a budget per tenant
//
// A record holds at most Config.MaxResponseBody of a successful answer,
// and Config.MaxStoredErrorBody (8 KiB by default) of an error answer,
// whose size a caller often chooses (an error quoting the request): a
// larger error is sent whole but stored as the problem
// error-body-not-stored, with its status, and is never run again. Records
// live for the engine's retention (24 h by default). So a tenant can fill
// the store with at most (keyed requests it may send per retention) ×
// (largest record); bound the first factor in front of the middleware,
// with a rate limiter keyed by the same tenant that answers 429 before
// the middleware is reached (golang.org/x/time/rate, one limiter per
// tenant), or with a quota of new keys per tenant and day.
//
// # Disconnects and shutdown
//
// A handler whose client goes away runs on by default: its context keeps
// the request's values but not its cancellation, its answer is stored, and
// the client's retry gets it (409 while it still runs), so that an
// operation cut short by a dropped connection is not run twice. Its
// context still ends when its lease is lost to a takeover, and when
// Config.ShutdownContext ends: give it the context you cancel once
// http.Server.Shutdown's grace period is over. Config.CancelOnDisconnect
// restores net/http's behaviour, at the cost documented there.
//
// # Transactions
//
// The handler runs under the context the engine gives it: r.Context()
// carries the store's transaction (idemsql.TxFromContext(r.Context()),
// idempg.TxFromContext(r.Context())). Business writes made through it commit
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
// Config.MaxResponseBody with ErrResponseTooLarge. It enforces a declared
// Content-Length as net/http does (http.ErrContentLength on the write that
// passes it; an answer shorter than declared is sent as net/http sends
// it, broken, and not stored). It still implements io.ReaderFrom, passes
// 103 Early Hints straight through (they announce resources, not a
// result), and unwraps for http.ResponseController, which reaches
// deadlines through it. Streaming endpoints should not be protected.
//
// The request body is read once, as it arrives, up to
// Config.MaxRequestBody, to fingerprint it, and given back to the handler
// from memory. A handler, or a goroutine it leaves behind
// (http.TimeoutHandler does), may use its body and ResponseWriter after
// it returned without harm: reads then fail with
// http.ErrBodyReadAfterClose, writes with ErrHandlerReturned, and nothing
// reaches another request.
//
// A response larger than Config.MaxResponseBody cannot be stored. Rather
// than send it unprotected or store it truncated, the middleware discards
// it, releases the key and answers 500 (response-too-large). A request
// body larger than Config.MaxRequestBody gets 413 before anything runs.
//
// # What is replayed
//
// Replays carry the status, the body and the headers that describe the
// result, security headers included (DefaultReplayHeaders plus
// Config.ReplayHeaders), never Set-Cookie, Date or hop-by-hop fields. The
// first answer itself is sent whole, cookies included. In
// idem.ModeReference and idem.ModeMarker a successful answer is stored
// compactly and replays are rebuilt by Config.ReplayFunc.
package idemhttp
