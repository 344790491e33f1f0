package idemproxy

import (
	"encoding/json"
	"net/http"
)

// ProblemTypeBase prefixes the type URI of the problems the proxy answers
// itself, beside idemhttp's (idemhttp.ProblemTypeBase); the fragment is
// the slug documented in docs/PROXY.md.
const ProblemTypeBase = "https://github.com/idem-go/idem/blob/main/docs/PROXY.md#"

// The slugs of the proxy's own problems.
const (
	// SlugUpstreamUnreachable: the request never reached the upstream
	// (no connection); nothing ran and the key was released.
	SlugUpstreamUnreachable = "upstream-unreachable"
	// SlugOutcomeUnknown: the request was sent and no whole answer came
	// back (a timeout, a connection lost); the key stays in flight until
	// its lease ends.
	SlugOutcomeUnknown = "upstream-outcome-unknown"
	// SlugAnswerNotStored is the body stored, with the original status,
	// for an answer passed through unstored (streamed, or larger than the
	// store limit): the operation ran and is never run again under its
	// key, and its answer cannot be replayed.
	SlugAnswerNotStored = "answer-not-stored"
)

// problem is one RFC 9457 answer, encoded once.
type problem struct {
	status int
	body   []byte
}

func newProblem(slug string, status int, title, detail string) *problem {
	body, err := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{ProblemTypeBase + slug, title, status, detail})
	if err != nil {
		panic(err) // static strings
	}
	return &problem{status: status, body: append(body, '\n')}
}

var (
	problemUnreachable = newProblem(SlugUpstreamUnreachable, http.StatusBadGateway,
		"Upstream unreachable",
		"The proxy could not connect to the service behind it, so the request was not sent: nothing ran and the key was released. Retry with the same key after Retry-After seconds.")
	problemUnknownLost = newProblem(SlugOutcomeUnknown, http.StatusBadGateway,
		"Upstream answer lost",
		"The request was sent to the service behind the proxy, which did not answer it whole: it may or may not have run. The key stays reserved until its lease ends (a retry meanwhile is answered 409 in-flight); a retry after that runs the request again, with the same Idempotency-Key sent to the service.")
	problemUnknownTimeout = newProblem(SlugOutcomeUnknown, http.StatusGatewayTimeout,
		"Upstream timed out",
		"The request was sent to the service behind the proxy, which did not answer in time: it may or may not have run. The key stays reserved until its lease ends (a retry meanwhile is answered 409 in-flight); a retry after that runs the request again, with the same Idempotency-Key sent to the service.")
)

// answerNotStored is the body stored for an answer passed through
// unstored, under the answer's own status.
func answerNotStored(status int) []byte {
	return newProblem(SlugAnswerNotStored, status,
		"Answer not stored",
		"The operation ran, but its answer was streamed or larger than the proxy stores, so it was passed through once and cannot be replayed. It will not run again under this key; use a new key for a new operation.").body
}

// writeProblem sends p on w, with Retry-After when retryAfter is set.
func writeProblem(w http.ResponseWriter, p *problem, retryAfter string) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Del("Content-Length")
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	w.WriteHeader(p.status)
	w.Write(p.body) //nolint:errcheck // the client is gone; nothing to do
}
