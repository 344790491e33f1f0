package idemcli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// demoProblemBase prefixes the type URI of the demo's own problems; the
// fragment is the slug listed in docs/DEMO.md. The idempotency layer's
// problems (409, 422, …) have their own, in docs/PROBLEMS.md.
const demoProblemBase = "https://github.com/idem-go/idem/blob/main/docs/DEMO.md#"

const (
	// maxOrderBody bounds POST /orders: an order is two short fields.
	maxOrderBody = 64 << 10
	// maxCartID bounds cart_id, as the key columns of the table do.
	maxCartID = 255
	// maxTotalCents is the largest integer a JSON number carries exactly in
	// every client (2^53-1, JavaScript's Number.MAX_SAFE_INTEGER).
	maxTotalCents = 1<<53 - 1
)

// ordersApp is the seed's orders API: POST /orders creates an order, GET
// /orders lists a tenant's orders (by cart), GET /orders/{id} reads one.
// It knows nothing of idempotency keys; the middleware in front of it does,
// and hands it the transaction to write in through the store's accessor.
type ordersApp struct {
	repo orderRepo
	// delay is slept inside the transaction before the order is written,
	// to make the in-flight window visible (--handler-delay).
	delay  time.Duration
	logger *slog.Logger
	now    func() time.Time
}

// routes returns the API. Every error, routing ones included, is
// application/problem+json.
func (a *ordersApp) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", a.create)
	mux.HandleFunc("GET /orders", a.list)
	mux.HandleFunc("GET /orders/{id}", a.get)
	// Patterns without a method catch the other methods: the mux's own 405
	// is text/plain.
	mux.HandleFunc("/orders", methodNotAllowed("GET, HEAD, POST"))
	mux.HandleFunc("/orders/{id}", methodNotAllowed("GET, HEAD"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeDemoProblem(w, http.StatusNotFound, "not-found", "Not found",
			fmt.Sprintf("There is nothing at %s. The demo serves POST /orders, GET /orders?cart_id=… and GET /orders/{id}.", r.URL.Path))
	})
	return mux
}

func methodNotAllowed(allow string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeDemoProblem(w, http.StatusMethodNotAllowed, "method-not-allowed", "Method not allowed",
			fmt.Sprintf("%s is not served on %s; use %s.", r.Method, r.URL.Path, allow))
	}
}

// orderRequest is the body of POST /orders. Pointers tell a missing field
// from a zero one.
type orderRequest struct {
	CartID     *string `json:"cart_id"`
	TotalCents *int64  `json:"total_cents"`
}

// decodeOrder reads and checks a POST /orders body. Its error is the
// problem's detail, written for the client.
//
// Unknown fields are refused: a misspelt field ("total_cent") would
// otherwise be dropped silently and the order created without it, and the
// stored answer would then be replayed to every retry of the mistake.
//
// Field names must match exactly, once each: encoding/json would take
// "CART_ID" for "cart_id", and the last of two "cart_id" fields.
func decodeOrder(r io.Reader) (orderRequest, error) {
	var req orderRequest
	raw, err := io.ReadAll(r)
	if err != nil {
		return req, describeJSONError(err)
	}
	if err := checkFieldNames(raw); err != nil {
		return req, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, describeJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return req, errors.New("the body goes on after the JSON object; send exactly one object")
	}
	switch {
	case req.CartID == nil:
		return req, errors.New(`"cart_id" is missing; send a string such as "c_42"`)
	case *req.CartID == "":
		return req, errors.New(`"cart_id" is empty`)
	case len(*req.CartID) > maxCartID:
		return req, fmt.Errorf(`"cart_id" is %d bytes long; the limit is %d`, len(*req.CartID), maxCartID)
	case !plainText(*req.CartID):
		return req, errors.New(`"cart_id" holds a control character or invalid UTF-8`)
	case req.TotalCents == nil:
		return req, errors.New(`"total_cents" is missing; send an integer number of cents such as 1900`)
	case *req.TotalCents < 0:
		return req, errors.New(`"total_cents" is negative`)
	case *req.TotalCents > maxTotalCents:
		return req, fmt.Errorf(`"total_cents" is larger than %d`, int64(maxTotalCents))
	}
	return req, nil
}

// checkFieldNames refuses an object whose top-level field names differ
// from the order's in case, or repeat. Anything else (not an object, bad
// JSON) is left to the decoder, which explains it better.
func checkFieldNames(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		switch {
		case seen[name]:
			return fmt.Errorf("%q appears twice; send each field once", name)
		case name != "cart_id" && name != "total_cents":
			return fmt.Errorf("unknown field %q; an order has only \"cart_id\" and \"total_cents\", spelt exactly so", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// plainText reports whether s is valid UTF-8 without control characters:
// what every database of the demo can store and every client can print.
func plainText(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// describeJSONError turns a decoding error into one sentence for the
// client, naming the field when there is one.
func describeJSONError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var maxErr *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return errors.New(`the body is empty; send a JSON object such as {"cart_id":"c_42","total_cents":1900}`)
	case errors.As(err, &maxErr):
		return fmt.Errorf("the body is larger than %d bytes: %w", maxErr.Limit, err)
	case errors.As(err, &typeErr):
		want := map[string]string{"cart_id": "a string", "total_cents": "an integer"}[typeErr.Field]
		if typeErr.Field == "" || want == "" {
			return errors.New("the body must be a JSON object")
		}
		return fmt.Errorf("%q must be %s, not a JSON %s", typeErr.Field, want, typeErr.Value)
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the body is not valid JSON")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no type for this error; its text is stable.
		return fmt.Errorf("unknown field %s; an order has only \"cart_id\" and \"total_cents\"", strings.TrimPrefix(err.Error(), "json: unknown field "))
	}
	return fmt.Errorf("the body could not be read: %v", err)
}

func (a *ordersApp) create(w http.ResponseWriter, r *http.Request) {
	injectFault(r.Context(), faultAfterClaim) // test-only crash injection (faults.go); off unless IDEM_FAULT is set
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			writeDemoProblem(w, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"Send the order as Content-Type: application/json.")
			return
		}
	}
	req, err := decodeOrder(http.MaxBytesReader(w, r.Body, maxOrderBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeDemoProblem(w, http.StatusRequestEntityTooLarge, "order-too-large", "Order too large",
			fmt.Sprintf("An order body is at most %d bytes.", tooLarge.Limit))
		return
	case err != nil:
		writeDemoProblem(w, http.StatusBadRequest, "invalid-order", "Invalid order", err.Error())
		return
	}
	ctx := r.Context()
	if a.delay > 0 {
		// The transaction is open: on PostgreSQL and MariaDB a retry now
		// finds the key in flight (409). On SQLite the transaction holds
		// the database's single write lock from BEGIN IMMEDIATE, so a retry
		// waits for the commit (up to idemsql's busy timeout) and replays.
		t := time.NewTimer(a.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			// The idempotency layer rolls back and releases the key.
			writeDemoProblem(w, http.StatusServiceUnavailable, "cancelled", "Request cancelled", "The request ended before the order was written.")
			return
		case <-t.C:
		}
	}
	o := order{
		ID:         newOrderID(),
		CartID:     *req.CartID,
		TotalCents: *req.TotalCents,
		// Microseconds: what every dialect stores, so that the answer
		// and a later GET show the same instant.
		CreatedAt: a.now().UTC().Truncate(time.Microsecond),
	}
	if err := a.repo.insert(ctx, tenantFrom(ctx), o); err != nil {
		a.internalError(w, r, "insert order", err)
		return
	}
	injectFault(ctx, faultAfterWrite) // test-only (faults.go): the order is written, not committed
	w.Header().Set("Location", "/orders/"+o.ID)
	writeJSON(w, http.StatusCreated, o)
}

func (a *ordersApp) list(w http.ResponseWriter, r *http.Request) {
	cartID := r.URL.Query().Get("cart_id")
	if !plainText(cartID) {
		writeDemoProblem(w, http.StatusBadRequest, "invalid-order", "Invalid cart_id",
			"cart_id holds a control character or invalid UTF-8.")
		return
	}
	tenant := tenantFrom(r.Context())
	orders, err := a.repo.list(r.Context(), tenant, cartID)
	if err != nil {
		a.internalError(w, r, "list orders", err)
		return
	}
	// The list stops at listLimit orders, oldest first; the header counts
	// them all (idem check --count-url reads it).
	total := len(orders)
	if total >= listLimit {
		if total, err = a.repo.count(r.Context(), tenant, cartID); err != nil {
			a.internalError(w, r, "count orders", err)
			return
		}
	}
	w.Header().Set("X-Total-Count", strconv.Itoa(total))
	writeJSON(w, http.StatusOK, orders)
}

func (a *ordersApp) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var o order
	err := errOrderNotFound
	if plainText(id) { // no order has any other id; the databases may refuse to compare one
		o, err = a.repo.get(r.Context(), tenantFrom(r.Context()), id)
	}
	switch {
	case errors.Is(err, errOrderNotFound):
		// Another tenant's order is not found either: ids do not leak
		// across tenants.
		writeDemoProblem(w, http.StatusNotFound, "order-not-found", "Order not found",
			fmt.Sprintf("There is no order %q for this caller.", id))
	case err != nil:
		a.internalError(w, r, "get order", err)
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

// internalError logs err and answers 500. Under the idempotency layer a
// 500 rolls the transaction back (the order included) and is stored for
// replay, as the seed and Stripe do.
func (a *ordersApp) internalError(w http.ResponseWriter, r *http.Request, op string, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client is gone and the layer rolls back; no one reads this
	}
	a.logger.ErrorContext(r.Context(), "demo: "+op, slog.Any("error", err))
	writeDemoProblem(w, http.StatusInternalServerError, "internal", "Internal error", "The server failed to "+op+".")
}

// newOrderID returns "ord_" and 20 random hex digits: ids that reveal
// nothing about the order count and need no round trip to generate.
func newOrderID() string {
	var b [10]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "ord_" + hex.EncodeToString(b[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		// Only orders and slices of orders come here: cannot happen.
		panic(err)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // the client is gone; nothing to do
}

// writeDemoProblem answers an RFC 9457 problem whose type is
// demoProblemBase+slug.
func writeDemoProblem(w http.ResponseWriter, status int, slug, title, detail string) {
	body, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}{demoProblemBase + slug, title, status, detail})
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(append(body, '\n')) //nolint:errcheck // the client is gone; nothing to do
}
