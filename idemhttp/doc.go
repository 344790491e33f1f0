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
// replayed: NewMiddleware refuses that unless Config.SharedKeySpace says it is
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
// # What is replayed
//
// Replays carry the status, the body and the headers that describe the
// result, security headers included (DefaultReplayHeaders plus
// Config.ReplayHeaders), never Set-Cookie, Date or hop-by-hop fields. The
// first answer itself is sent whole, cookies included. In
// idem.ModeReference and idem.ModeMarker a successful answer is stored
// compactly and replays are rebuilt by Config.ReplayFunc.
//
// # Options
//
// Config.KeyHeader or Config.KeyFunc read the key from elsewhere than
// Idempotency-Key. Config.CanonicalJSON, Config.IgnoreJSON (JSON
// Pointers to a timestamp, a rotating token) and Config.FingerprintFunc
// say what of the body counts. Config.OnReplay sees every replay, and
// FirstExecution tells a handler whether an earlier execution may have
// begun its work. A route with its own lease, retention, methods, storage
// mode, wait or 5xx rule is wrapped in Middleware.With(policy), starting
// from Middleware.Policy.
//
// # Design
//
// How requests and answers are buffered: docs/DESIGN-HTTP.md. The
// protocol, situation by situation: docs/PROTOCOL.md.
package idemhttp
