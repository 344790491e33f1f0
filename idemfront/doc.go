// Package idemfront is the kit a front end of idem is built on: what
// every adapter of a protocol to idem.Engine needs, written once, so that
// net/http (idemhttp), gRPC, Connect, Gin, Echo, Fiber or a reverse proxy
// each add only their protocol's words.
//
// A front end does five things per call. It reads the key and the
// tenant, and checks them:
//
//	key, err := idemfront.OneKey(md.Get("idempotency-key"))
//	if err := idemfront.ValidateTenant(tenant); err != nil { … } // a server bug, not the caller's
//
// It runs the handler through the engine, on a context the caller's going
// away does not cancel:
//
//	ctx, stop := idemfront.Detach(callerCtx, shutdownCtx)
//	defer stop()
//	out, err := engine.Do(ctx, op, run)
//
// It answers an error by its kind, in its protocol's codes, with the
// retry advice the kind deserves:
//
//	a := front.Classify(err, idemfront.State{Ran: ran, Ctx: ctx, CallerCtx: callerCtx})
//	a.Log(ctx, logger, "idemgrpc", op.Key)
//	switch a.Kind {
//	case idemfront.InFlight: // gRPC: UNAVAILABLE with RetryInfo{a.RetryAfter}
//	case idemfront.Mismatch: // gRPC: FAILED_PRECONDITION
//	…
//	}
//
// It stores and replays only the response headers (or metadata) of an
// allowlist, compared without regard to case ([Headers]), and marks a
// replay as such.
//
// And it passes the front-end conformance suite, idemfronttest, which
// proves the whole contract (one execution for duplicates released at
// once, replays byte for byte with their marker, the answers above,
// tenants kept apart, limits, panics, disconnects, the handler's writes
// committed with the answer) against the front end itself.
//
// The package uses the standard library only, and knows nothing of any
// protocol: its words are the engine's (an operation, a key, a tenant, a
// call that ran or did not), never a status code.
package idemfront
