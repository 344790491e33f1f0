package idemhttp

import (
	"encoding/json"
	"fmt"
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
		"This key was already used with a different method, path, query, media type, body or headers. Nothing ran. Use a new key for a new operation.")
	problemInFlight = newProblem("in-flight", http.StatusConflict,
		"Request with this Idempotency-Key in progress",
		"An earlier request with this key is still running. Retry with the same key after Retry-After seconds to get its answer.")
	problemInternal = newProblem("internal-error", http.StatusInternalServerError,
		"Internal error",
		"The request failed in the idempotency layer. Retry with the same key.")
	problemReplayFailed = newProblem("replay-failed", http.StatusInternalServerError,
		"Stored answer cannot be replayed",
		"The operation completed earlier but its stored answer cannot be rebuilt. It will not run again under this key; report it to the API's operators.")
)

// The slug of the body stored in place of an error body too large to
// store (Config.MaxStoredErrorBody); its status is the original's.
const slugErrorBodyNotStored = "error-body-not-stored"

// problems are the answers whose truth depends on whether the handler ran
// and on whether the store can roll its work back (StoreInfo.Transactional):
// a client deciding whether to retry must not be told that work was
// rolled back when it stands.
type problems struct {
	storeUnavailable    *problem // the handler did not run
	storeUnavailableRan *problem
	requestCancelled    *problem // the handler did not run
	requestCancelledRan *problem
	leaseLost           *problem
	handlerPanic        *problem
	responseTooLarge    *problem
}

// Shared by both kinds of store: nothing had run.
var (
	problemStoreUnavailable = newProblem("store-unavailable", http.StatusServiceUnavailable,
		"Idempotency store unavailable",
		"The server could not reach the store that records idempotency keys, so it did not run this request (it fails closed rather than risk running it twice). Retry with the same key after Retry-After seconds.")
	problemRequestCancelled = newProblem("request-cancelled", http.StatusInternalServerError,
		"Request cancelled",
		"The request was cancelled (the client went away, a deadline passed, or the server is stopping) before it ran. Nothing ran; retry with the same key.")
)

// problemsTransactional are the texts for a store whose unit of work is a
// database transaction: what the handler wrote through it rolls back.
var problemsTransactional = problems{
	storeUnavailable: problemStoreUnavailable,
	storeUnavailableRan: newProblem("store-unavailable", http.StatusServiceUnavailable,
		"Idempotency store unavailable",
		"The request ran, but the server could not record its answer, so its work was rolled back and the key released. Retry with the same key after Retry-After seconds: it runs again, or, if the store did record the answer before it failed, the answer is replayed."),
	requestCancelled: problemRequestCancelled,
	requestCancelledRan: newProblem("request-cancelled", http.StatusInternalServerError,
		"Request cancelled",
		"The request was cancelled (the client went away, a deadline passed, or the server is stopping) while it ran; its work was rolled back and the key released. Retrying with the same key runs it again."),
	leaseLost: newProblem("lease-lost", http.StatusConflict,
		"Request with this Idempotency-Key taken over",
		"This execution ran past its lease and a retry took the key over; its work was rolled back and its answer discarded. Retry with the same key to get the answer of the execution that took over."),
	handlerPanic: newProblem("handler-panic", http.StatusInternalServerError,
		"Internal error",
		"The request failed on the server; its work was rolled back and the key released. Retrying with the same key runs it again."),
	responseTooLarge: newProblem("response-too-large", http.StatusInternalServerError,
		"Response too large to store",
		"The answer was larger than the server can store for replays, so the work was rolled back and the key released rather than leaving the operation unprotected. Retrying will fail the same way; report it to the API's operators."),
}

// problemsNotTransactional are the texts for a store that keeps only the
// records (Redis, memory): nothing the handler did can be undone, so once
// it ran its key is not released for a retry to run it again, except
// after its lease ends.
var problemsNotTransactional = problems{
	storeUnavailable: problemStoreUnavailable,
	storeUnavailableRan: newProblem("store-unavailable", http.StatusServiceUnavailable,
		"Idempotency store unavailable",
		"The request ran, but the server could not record its answer. This store cannot roll work back: what the request did stands, and the key stays reserved until its lease ends (a retry meanwhile is answered 409 in-flight); a retry after that runs the request again."),
	requestCancelled: problemRequestCancelled,
	requestCancelledRan: newProblem("request-cancelled", http.StatusInternalServerError,
		"Request cancelled",
		"The request was cancelled (the client went away, a deadline passed, or the server is stopping) while it ran. This store cannot roll work back: what the request did stands, and its answer was kept for the retry. Retry with the same key to get it (409 in-flight while the server still holds the key)."),
	leaseLost: newProblem("lease-lost", http.StatusConflict,
		"Request with this Idempotency-Key taken over",
		"This execution ran past its lease and a retry took the key over; its answer was discarded, but what it did stands, since this store cannot roll work back. Retry with the same key to get the answer of the execution that took over."),
	handlerPanic: newProblem("handler-panic", http.StatusInternalServerError,
		"Internal error",
		"The request failed on the server while it ran. This store cannot roll work back: what it did before failing stands, so the key stays reserved until its lease ends (a retry meanwhile is answered 409 in-flight); a retry after that runs it again."),
	responseTooLarge: newProblem("response-too-large", http.StatusInternalServerError,
		"Response too large to store",
		"The answer was larger than the server can store for replays, so it was discarded and the key released rather than leaving the operation unprotected. This store cannot roll work back: what the request did stands, and a retry runs it again, failing the same way; report it to the API's operators."),
}

// errorBodyNotStored is the body stored in place of an error answer's body
// larger than Config.MaxStoredErrorBody: a replay says what happened, with
// the original status, rather than send a truncated body as if it were
// the original.
func errorBodyNotStored(status, size int) []byte {
	body, err := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{ProblemTypeBase + slugErrorBodyNotStored, "Error answer not stored whole", status,
		fmt.Sprintf("This is a replay. The first answer to this request had status %d and a body of %d bytes, more than the server stores for an error answer; this body stands in for it. The operation did not run again.", status, size)})
	if err != nil {
		panic(err) // plain values: cannot happen
	}
	return append(body, '\n')
}

// writeProblem sends p with the Content-Type it needs, and returns its
// status. Headers the handler may have set never reach w: they stay in
// the recorder.
func writeProblem(w http.ResponseWriter, p *problem) int {
	h := w.Header()
	h["Content-Type"] = contentTypeProblem
	h["X-Content-Type-Options"] = nosniff
	h.Del("Content-Length")
	w.WriteHeader(p.status)
	w.Write(p.body) //nolint:errcheck // the client is gone; nothing to do
	return p.status
}

// Shared, never modified header values: assigning them costs nothing.
var (
	contentTypeProblem = []string{ContentTypeProblem}
	nosniff            = []string{"nosniff"}
	replayedTrue       = []string{"true"}
)
