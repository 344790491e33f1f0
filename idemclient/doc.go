// Package idemclient is the client half of the Idempotency-Key contract: an
// http.RoundTripper that names each operation with a key once and retries
// it safely. It imports nothing outside the standard library.
//
// # What the Transport does
//
// For a covered request (by default POST and PATCH, or any request that
// already carries an Idempotency-Key), Transport:
//
//   - sets Idempotency-Key to a fresh UUIDv4 before the first attempt,
//     unless the caller set one;
//   - sends that same key and the same body bytes on every retry, and never
//     a new key: a new key per attempt would defeat the server's
//     deduplication;
//   - retries connection errors, timeouts (including its own per-attempt
//     timeout, Transport.AttemptTimeout), 429 and 502/503/504 up to
//     Transport.MaxAttempts failed attempts, and 409 (in flight) for up to
//     Transport.InFlightTimeout, honouring Retry-After in seconds or as an
//     HTTP date;
//   - waits a capped exponential backoff with jitter between attempts, never
//     less than half of Transport.BaseDelay, even when Retry-After says 0,
//     and stops at once when the request's context ends;
//   - never retries another 4xx, a 500, or a response marked
//     Idempotent-Replayed: true (a replay is the stored answer; asking
//     again returns it again).
//
// Requests whose method is not covered pass through unchanged, once.
//
// # Redirects
//
// A 307 or 308 asks for the same request at another address: it is the
// same operation, and its key goes with it. http.Client builds each
// redirected request from the caller's original, which does not hold the
// key the Transport made; the Transport finds that key again through the
// redirect response (Request.Response) and sends it to the new address,
// so a cluster that sends a retry to another node replays the result
// instead of running the operation again. A key the caller set is copied
// by http.Client onto every hop. A 301, 302 or 303 turns the request into
// a GET for the result, a request of its own, which gets no key.
//
// # Sizing the budgets with the server's lease
//
// A 409 means another execution holds the key. When that execution's
// process died, the key stays held until its lease ends on the server (90s
// by default with idem), and only then can a retry take it over and get an
// answer. InFlightTimeout, counted from the first 409, must therefore be
// longer than the server's lease; its default, 2 minutes, is. A client
// that gives up earlier returns 409 for an operation the server may have
// begun (charged a card) without storing its outcome, and leaves its
// caller to guess. A live execution keeps its key as long as it runs
// (idem's heartbeat extends the lease), so the budget must also exceed the
// slowest handler. The pauses after 409s grow to MaxDelay (5s by default),
// so a finished execution is noticed within a few seconds.
//
// In short, size them together:
//
//	InFlightTimeout > server lease + slowest handler + MaxDelay
//
// The defaults (2 minutes against a 90s lease) leave 25s for the handler
// that takes the key over. A server with a shorter lease takes a dead
// execution's key over sooner (its heartbeat keeps live ones), and lets
// clients keep a shorter budget; one with slow handlers needs a longer
// budget on every client. The Retry-After of idemhttp's 409 is a fixed
// pause (idemhttp.Config.RetryAfter, 1s by default), not the end of the
// lease: the Transport waits it out, and keeps asking until the budget
// ends.
//
// Bound the whole call with the request's context: it caps every budget.
// A caller whose context ends before the server's lease can end gets the
// last 409 (or the context's error) back, and should retry later with the
// same key, which the Trace holds.
//
// # Learning what happened
//
// RoundTrip returns the last response like any RoundTripper. To learn the
// key, the number of attempts and whether the answer was a replay, put a
// *Trace in the request's context with WithTrace and read it after the
// call returns:
//
//	var tr idemclient.Trace
//	req = req.WithContext(idemclient.WithTrace(ctx, &tr))
//	resp, err := client.Do(req)
//	// tr.Key, tr.Attempts, tr.Replayed, tr.History
//
// # Retried and not retried
//
// A 409 from an idem-protected server means "the same operation is still
// running": waiting and asking again with the same key yields the stored
// answer once it completes. A 429 or 503 asks the client to slow down.
// Connection errors and timeouts are the reason keys exist: the request
// may or may not have been executed, and only a retry with the same key
// can tell without running it twice.
package idemclient
