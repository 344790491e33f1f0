// Package idemclient is the client half of the Idempotency-Key contract: an
// http.RoundTripper that names each operation with a key once and retries
// it safely.
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
//     timeout, Transport.AttemptTimeout), 409 (in flight), 429 and
//     502/503/504, honouring Retry-After in seconds or as an HTTP date;
//   - waits a capped exponential backoff with full jitter between
//     attempts, stops after Transport.MaxAttempts, and stops at once when
//     the request's context ends;
//   - never retries another 4xx, a 500, or a response marked
//     Idempotent-Replayed: true (a replay is the stored answer; asking
//     again returns it again).
//
// Requests whose method is not covered pass through unchanged, once.
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
