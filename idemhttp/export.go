package idemhttp

import (
	"slices"
	"time"

	"github.com/idem-go/idem/idemfront"
)

// What a front end over another HTTP server (fasthttp) needs to answer
// as this middleware does, byte for byte: the same problems, the same
// Retry-After, the same headers never replayed.

// NeverReplayedHeaders returns the response headers no replay carries,
// whatever the allowlist says (Set-Cookie, Date, the hop-by-hop fields,
// Idempotent-Replayed): the never list of idemfront.NewHeaders.
func NeverReplayedHeaders() []string { return slices.Clone(neverReplayed) }

// ProblemFor returns the status and the RFC 9457 body (of
// ContentTypeProblem) with which the middleware answers a, its texts true
// of a store that rolls the handler's work back (transactional,
// idemfront.Front.Transactional) or not. An answer that is the handler's
// own (Executed, Replayed, …) has no problem: ProblemFor returns the
// internal-error one. The front end adds Retry-After (RetryAfterSeconds)
// when a.Retry is idemfront.RetryLater. The body is shared: do not modify
// it.
func ProblemFor(a idemfront.Answer, transactional bool) (status int, body []byte) {
	var p *problem
	switch a.Kind {
	case idemfront.KeyRequired:
		p = problemKeyRequired
	case idemfront.InvalidKey:
		// The texts naming the default key header, Idempotency-Key.
		p = problemInvalidKey
	case idemfront.Unauthenticated:
		p = problemUnauthenticated
	case idemfront.RequestTooLarge:
		p = problemRequestTooLarge
	case idemfront.RequestUnreadable:
		p = problemRequestUnreadable
	case idemfront.ReplayFailed:
		p = problemReplayFailed
	default:
		m := &Middleware{problems: &problemsNotTransactional}
		if transactional {
			m.problems = &problemsTransactional
		}
		p = m.problemFor(a)
	}
	return p.status, p.body
}

// ErrorBodyNotStored returns the body the middleware stores in place of an
// error answer's body of size bytes, larger than
// Config.MaxStoredErrorBody: the problem error-body-not-stored, with the
// original status, so that a replay says what happened rather than send a
// truncated body as if it were the original.
func ErrorBodyNotStored(status, size int) []byte { return errorBodyNotStored(status, size) }

// RetryAfterSeconds is the Retry-After value the middleware sends for a
// delay d: rounded up to whole seconds, at least 1.
func RetryAfterSeconds(d time.Duration) int { return retryAfterSeconds(d) }
