package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

func (a *App) create(w http.ResponseWriter, r *http.Request) {
	injectFault(r.Context(), faultAfterClaim) // crash tests only (faults.go); a no-op in release builds
	if r.URL.RawQuery != "" {
		// Ignored, a parameter would still take part in the key's
		// fingerprint, and the client would believe it meant something.
		refuse(w, r, http.StatusBadRequest, "invalid-order", "Invalid order",
			"POST /orders takes no query parameters; send the order in the body.")
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			refuse(w, r, http.StatusUnsupportedMediaType, "unsupported-media-type", "Unsupported media type",
				"Send the order as Content-Type: application/json.")
			return
		}
	}
	req, err := decodeOrder(http.MaxBytesReader(w, r.Body, maxOrderBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		refuse(w, r, http.StatusRequestEntityTooLarge, "order-too-large", "Order too large",
			fmt.Sprintf("An order body is at most %d bytes.", tooLarge.Limit))
		return
	case err != nil:
		refuse(w, r, http.StatusBadRequest, "invalid-order", "Invalid order", err.Error())
		return
	}
	ctx := r.Context()
	if a.delay > 0 {
		// The key is claimed and the handler's transaction not begun yet
		// (it begins at its first statement, even on SQLite): a retry now
		// finds the key in flight (409) on every database.
		t := time.NewTimer(a.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			// The server is stopping at once (or the lease was lost):
			// nothing was written, and the layer rolls back and releases
			// the key. A client that merely went away does not end ctx:
			// its request runs on, for its retry to get the answer.
			refuse(w, r, http.StatusServiceUnavailable, "cancelled", "Request cancelled", "The request ended before the order was written.")
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
	if err := a.repo.insert(ctx, TenantFrom(ctx), o); err != nil {
		a.internalError(w, r, "insert order", err)
		return
	}
	injectFault(ctx, faultAfterWrite) // crash tests only (faults.go): the order is written, not committed
	w.Header().Set("Location", "/orders/"+o.ID)
	writeJSON(w, http.StatusCreated, o)
}

// refuse answers a request turned down before any work began: validation
// failed. Under an Idempotency-Key the answer is marked idem.NotExecuted:
// it is sent, nothing is stored, and the key is released, so that the
// client's corrected retry with the same key runs (Stripe saves no result
// when the endpoint never began executing). Without a key there is nothing
// to mark.
func refuse(w http.ResponseWriter, r *http.Request, status int, slug, title, detail string) {
	idem.NotExecuted(r.Context())
	writeProblem(w, status, slug, title, detail)
}

func (a *App) list(w http.ResponseWriter, r *http.Request) {
	cartID, err := listQuery(r.URL.RawQuery)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, "invalid-order", "Invalid query", err.Error())
		return
	}
	tenant := TenantFrom(r.Context())
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

// listQuery reads the query of GET /orders: nothing, or cart_id once. A
// parameter the decoder would drop (a bad %-escape, a ';'), repeat or
// ignore is refused: answering for another cart than the one asked about,
// or for all of them, would be answering another question.
func listQuery(raw string) (string, error) {
	q, err := url.ParseQuery(raw)
	if err != nil {
		return "", errors.New("the query string is malformed (a '%' not followed by two hex digits, or a ';'); percent-encode the cart id")
	}
	for name, values := range q {
		switch {
		case name != "cart_id":
			return "", fmt.Errorf("unknown query parameter %s; GET /orders takes only cart_id", quote(name))
		case len(values) > 1:
			return "", errors.New("cart_id appears more than once; send it once")
		}
	}
	cartID := q.Get("cart_id")
	if !plainText(cartID) {
		return "", errors.New("cart_id holds a control character or invalid UTF-8")
	}
	return cartID, nil
}

func (a *App) get(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var o order
	err := errOrderNotFound
	if plainText(id) { // no order has any other id; the databases may refuse to compare one
		o, err = a.repo.get(r.Context(), TenantFrom(r.Context()), id)
	}
	switch {
	case errors.Is(err, errOrderNotFound):
		// Another tenant's order is not found either: ids do not leak
		// across tenants.
		writeProblem(w, http.StatusNotFound, "order-not-found", "Order not found",
			fmt.Sprintf("There is no order %s for this caller.", quote(id)))
	case err != nil:
		a.internalError(w, r, "get order", err)
	default:
		writeJSON(w, http.StatusOK, o)
	}
}

// internalError logs err and answers 500. Under the idempotency layer a
// 500 rolls the transaction back (the order included) and is stored for
// replay, as Stripe does.
func (a *App) internalError(w http.ResponseWriter, r *http.Request, op string, err error) {
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		return // the client is gone and the layer rolls back; no one reads this
	}
	a.logger.ErrorContext(r.Context(), "demo: "+op, slog.Any("error", err))
	writeProblem(w, http.StatusInternalServerError, "internal", "Internal error", "The server failed to "+op+".")
}

// newOrderID returns "ord_" and 20 random hex digits: ids that reveal
// nothing about the order count and need no round trip to generate.
func newOrderID() string {
	var b [10]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return "ord_" + hex.EncodeToString(b[:])
}
