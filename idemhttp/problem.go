package idemhttp

import (
	"encoding/json"
	"net/http"
)

// ProblemTypeBase prefixes the type URI of every problem this package
// answers; the fragment is the slug documented in docs/PROBLEMS.md.
const ProblemTypeBase = "https://github.com/idem-go/idem/blob/main/docs/PROBLEMS.md#"

// ContentTypeProblem is the media type of the error bodies (RFC 9457).
const ContentTypeProblem = "application/problem+json"

// problem is one RFC 9457 answer. Every problem the middleware sends is
// known in advance, so its body is encoded once, at start-up, and an error
// answer costs no encoding: a flood of 409s from eager retries stays
// cheap.
type problem struct {
	slug   string
	status int
	title  string
	detail string
	body   []byte
}

func newProblem(slug string, status int, title, detail string) *problem {
	p := &problem{slug: slug, status: status, title: title, detail: detail}
	body, err := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{ProblemTypeBase + slug, title, status, detail})
	if err != nil {
		panic(err) // static strings: cannot happen
	}
	p.body = append(body, '\n')
	return p
}

// The problems, one per slug of docs/PROBLEMS.md. Keep the two in step.
var (
	problemKeyRequired = newProblem("key-required", http.StatusBadRequest,
		"Idempotency-Key required",
		"This endpoint requires an Idempotency-Key header. Generate a unique key (a UUIDv4) per operation and send the same key on every retry of it.")
	problemInvalidKey = newProblem("invalid-key", http.StatusBadRequest,
		"Invalid Idempotency-Key",
		"Send exactly one Idempotency-Key field holding 1 to 255 visible ASCII characters, bare or as a quoted string, without commas when bare.")
	problemUnauthenticated = newProblem("unauthenticated", http.StatusUnauthorized,
		"Caller not identified",
		"The server could not tell whose key space this request belongs to. Authenticate and retry.")
	problemRequestTooLarge = newProblem("request-too-large", http.StatusRequestEntityTooLarge,
		"Request body too large",
		"The request body is larger than this endpoint accepts for an idempotent request. Nothing was stored; do not retry unchanged.")
	problemRequestUnreadable = newProblem("request-unreadable", http.StatusBadRequest,
		"Request body unreadable",
		"The request body could not be read whole. Nothing ran and nothing was stored; retry with the same key.")
	problemFingerprintMismatch = newProblem("fingerprint-mismatch", http.StatusUnprocessableEntity,
		"Idempotency-Key reused for another request",
		"This key was already used with a different method, path, query, body or headers. Nothing ran. Use a new key for a new operation.")
	problemInFlight = newProblem("in-flight", http.StatusConflict,
		"Request with this Idempotency-Key in progress",
		"An earlier request with this key is still running. Retry with the same key after Retry-After seconds to get its answer.")
	problemLeaseLost = newProblem("lease-lost", http.StatusConflict,
		"Request with this Idempotency-Key taken over",
		"This execution ran past its lease and a retry took the key over; its work was rolled back. Retry with the same key to get the answer of the execution that won.")
	problemStoreUnavailable = newProblem("store-unavailable", http.StatusServiceUnavailable,
		"Idempotency store unavailable",
		"The server could not record this request, so it did not complete it. Retry with the same key after Retry-After seconds.")
	problemHandlerPanic = newProblem("handler-panic", http.StatusInternalServerError,
		"Internal error",
		"The request failed; its work was rolled back and the key released. Retrying with the same key runs it again.")
	problemRequestCancelled = newProblem("request-cancelled", http.StatusInternalServerError,
		"Request cancelled",
		"The request was cancelled before it completed; its work was rolled back and the key released. Retrying with the same key runs it again.")
	problemResponseTooLarge = newProblem("response-too-large", http.StatusInternalServerError,
		"Response too large to store",
		"The answer was larger than the server can store for replays, so the work was rolled back and the key released rather than leaving the operation unprotected. Retrying will fail the same way; report it to the API's operators.")
	problemInternal = newProblem("internal-error", http.StatusInternalServerError,
		"Internal error",
		"The request failed in the idempotency layer. Retry with the same key.")
	problemReplayFailed = newProblem("replay-failed", http.StatusInternalServerError,
		"Stored answer cannot be replayed",
		"The operation completed earlier but its stored answer cannot be rebuilt. It will not run again under this key; report it to the API's operators.")
)

// writeProblem sends p with the Content-Type it needs. Headers the
// handler may have set never reach w: they stay in the recorder.
func writeProblem(w http.ResponseWriter, p *problem) {
	h := w.Header()
	h["Content-Type"] = contentTypeProblem
	h["X-Content-Type-Options"] = nosniff
	h.Del("Content-Length")
	w.WriteHeader(p.status)
	w.Write(p.body) //nolint:errcheck // the client is gone; nothing to do
}

// Shared, never modified header values: assigning them costs nothing.
var (
	contentTypeProblem = []string{ContentTypeProblem}
	nosniff            = []string{"nosniff"}
	replayedTrue       = []string{"true"}
)
