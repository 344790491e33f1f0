package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idempg"
)

// schema is the API's own tables, next to idem's (idempg.Migrate).
const schema = `
CREATE TABLE IF NOT EXISTS payments (
	id             text        PRIMARY KEY,
	merchant       text        NOT NULL,
	amount_cents   bigint      NOT NULL CHECK (amount_cents > 0),
	currency       text        NOT NULL,
	charge_id      text        NOT NULL UNIQUE,
	refunded_cents bigint      NOT NULL DEFAULT 0 CHECK (refunded_cents BETWEEN 0 AND amount_cents),
	created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS payments_merchant_idx ON payments (merchant, created_at);
CREATE TABLE IF NOT EXISTS refunds (
	id           text        PRIMARY KEY,
	payment_id   text        NOT NULL REFERENCES payments (id),
	amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
	network_id   text        NOT NULL UNIQUE,
	created_at   timestamptz NOT NULL DEFAULT now()
)`

// Payment is a payment as the API answers it.
type Payment struct {
	ID            string    `json:"id"`
	AmountCents   int64     `json:"amount_cents"`
	Currency      string    `json:"currency"`
	ChargeID      string    `json:"charge_id"`
	RefundedCents int64     `json:"refunded_cents"`
	CreatedAt     time.Time `json:"created_at"`
}

// Refund is a refund as the API answers it.
type Refund struct {
	ID          string    `json:"id"`
	PaymentID   string    `json:"payment_id"`
	AmountCents int64     `json:"amount_cents"`
	NetworkID   string    `json:"network_id"`
	CreatedAt   time.Time `json:"created_at"`
}

type paymentRequest struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	CardToken   string `json:"card_token"`
}

type refundRequest struct {
	AmountCents int64 `json:"amount_cents"`
}

// api holds what the handlers share.
type api struct {
	pool   *pgxpool.Pool
	cards  *cardnet.Client
	logger *slog.Logger
}

// cardTimeout bounds one call to the card network. A call cut short has an
// unknown outcome: see cardFailed.
const cardTimeout = 10 * time.Second

// createPayment charges a card and records the payment. It runs under
// idemhttp: a retry with the same Idempotency-Key gets this answer back,
// and a retry that takes over from an execution that died (a crash, a
// kill -9) gets the recorded charge from idem.Step instead of charging
// again.
func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req paymentRequest
	if err := decode(r, &req); err != nil {
		invalid(w, r, err)
		return
	}
	if err := req.validate(); err != nil {
		invalid(w, r, err)
		return
	}

	// The charge first, the rows after (docs/SIDE-EFFECTS.md's recipe):
	// the step is recorded on a pool connection of its own, and the
	// transaction of the rows holds one from its first statement to its
	// commit, so charging inside it would take two connections per request
	// for the whole card call (and on SQLite a step after the first
	// statement is refused).
	charge, err := idem.Step(ctx, "charge", func(ctx context.Context) (cardnet.Charge, error) {
		ctx, cancel := context.WithTimeout(ctx, cardTimeout)
		defer cancel()
		return a.cards.Charge(ctx, idem.DownstreamKey(ctx, "charge"), cardnet.ChargeRequest{
			AmountCents: req.AmountCents, Currency: req.Currency, CardToken: req.CardToken,
		})
	})
	if err != nil {
		a.cardFailed(w, r, "charge", err)
		return
	}
	if charge.Status != "succeeded" {
		// A result, stored and replayed to every retry: the card is not
		// tried again under this key. Nothing of it may stay in the
		// database.
		idem.RollbackWrites(ctx)
		writeProblem(w, http.StatusPaymentRequired, "card declined", "the card network declined the card: "+charge.DeclineCode)
		return
	}

	p := Payment{ID: newID("pay"), AmountCents: req.AmountCents, Currency: req.Currency, ChargeID: charge.ID}
	err = idempg.DB(ctx, a.pool).QueryRow(ctx, `
		INSERT INTO payments (id, merchant, amount_cents, currency, charge_id)
		VALUES ($1, $2, $3, $4, $5)
		RETURNING created_at`,
		p.ID, merchantFrom(ctx), p.AmountCents, p.Currency, p.ChargeID).Scan(&p.CreatedAt)
	if err != nil {
		a.internal(w, r, "insert payment", err)
		return
	}
	w.Header().Set("Location", "/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, p)
}

// createRefund refunds part or all of a payment, as createPayment charges
// it.
func (a *api) createRefund(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var req refundRequest
	if err := decode(r, &req); err != nil {
		invalid(w, r, err)
		return
	}
	if req.AmountCents <= 0 {
		invalid(w, r, errors.New("amount_cents must be a positive number of cents"))
		return
	}
	// Read through the pool, not the transaction: the transaction would
	// hold its connection through the card call (see createPayment). The
	// network refuses a refund larger than what is left of the charge, so
	// this check only spares it a call.
	var p Payment
	err := a.pool.QueryRow(ctx, `
		SELECT id, amount_cents, currency, charge_id, refunded_cents, created_at
		FROM payments WHERE id = $1 AND merchant = $2`,
		r.PathValue("id"), merchantFrom(ctx)).Scan(&p.ID, &p.AmountCents, &p.Currency, &p.ChargeID, &p.RefundedCents, &p.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		// Not stored (a 404 says the endpoint did not run): the same key
		// may be used once the payment exists.
		writeProblem(w, http.StatusNotFound, "no such payment", "")
		return
	}
	if err != nil {
		a.internal(w, r, "read payment", err)
		return
	}
	if left := p.AmountCents - p.RefundedCents; req.AmountCents > left {
		invalid(w, r, fmt.Errorf("amount_cents is %d but %d cents are left to refund", req.AmountCents, left))
		return
	}

	refund, err := idem.Step(ctx, "refund", func(ctx context.Context) (cardnet.Refund, error) {
		ctx, cancel := context.WithTimeout(ctx, cardTimeout)
		defer cancel()
		return a.cards.Refund(ctx, idem.DownstreamKey(ctx, "refund"), cardnet.RefundRequest{
			ChargeID: p.ChargeID, AmountCents: req.AmountCents,
		})
	})
	if err != nil {
		a.cardFailed(w, r, "refund", err)
		return
	}

	rf := Refund{ID: newID("rf"), PaymentID: p.ID, AmountCents: refund.AmountCents, NetworkID: refund.ID}
	db := idempg.DB(ctx, a.pool)
	err = db.QueryRow(ctx, `
		INSERT INTO refunds (id, payment_id, amount_cents, network_id)
		VALUES ($1, $2, $3, $4)
		RETURNING created_at`,
		rf.ID, rf.PaymentID, rf.AmountCents, rf.NetworkID).Scan(&rf.CreatedAt)
	if err == nil {
		_, err = db.Exec(ctx, `UPDATE payments SET refunded_cents = refunded_cents + $1 WHERE id = $2`, rf.AmountCents, rf.PaymentID)
	}
	if err != nil {
		a.internal(w, r, "insert refund", err)
		return
	}
	w.Header().Set("Location", "/payments/"+p.ID+"/refunds/"+rf.ID)
	writeJSON(w, http.StatusCreated, rf)
}

// cardFailed answers a step whose call to the card network did not give
// a result, as docs/SIDE-EFFECTS.md's recipe says.
func (a *api) cardFailed(w http.ResponseWriter, r *http.Request, step string, err error) {
	ctx := r.Context()
	if errors.Is(err, idem.ErrStepNotSaved) || errors.Is(err, idem.ErrLeaseLost) {
		// The network answered (or may have) and idem could not record
		// it, or the key was taken over: idem discards whatever this
		// handler writes and answers itself (503 with Retry-After, the
		// key held until its lease ends; or 409 lease-lost). Write
		// nothing.
		return
	}
	var ce *cardnet.CallError
	if errors.As(err, &ce) && !cardnet.IsUnknownOutcome(err) {
		// The network refused the request itself: a result, stored and
		// replayed, since asking again would be refused again.
		writeProblem(w, http.StatusUnprocessableEntity, "refused by the card network", ce.Code+": "+ce.Message)
		return
	}
	// No answer (a timeout, a connection error, a 5xx): the money may
	// have moved. Answer 503: these routes release the key on a 5xx
	// (idemhttp.Config.ReleaseOn5xx), so nothing is stored and the
	// client's retry runs the step again, sending the network the same
	// downstream key, under which it answers with what it did the first
	// time and moves no money twice. (Not idem.NotExecuted: the request
	// did begin executing.)
	a.logger.WarnContext(ctx, "card network call failed; the retry will ask again under the same downstream key",
		slog.String("step", step), slog.Any("error", err))
	w.Header().Set("Retry-After", "1")
	writeProblem(w, http.StatusServiceUnavailable, "card network unavailable", "retry with the same Idempotency-Key")
}

// internal answers 500. On the card routes idemhttp releases the key
// (ReleaseOn5xx) with its recorded steps and rolls the handler's writes
// back: the retry takes the key over, gets the recorded charge or refund
// from idem.Step, and writes its rows again.
func (a *api) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	a.logger.ErrorContext(r.Context(), what, slog.Any("error", err))
	writeProblem(w, http.StatusInternalServerError, "internal error", "")
}

// getPayment answers one payment of the merchant.
func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	var p Payment
	err := a.pool.QueryRow(r.Context(), `
		SELECT id, amount_cents, currency, charge_id, refunded_cents, created_at
		FROM payments WHERE id = $1 AND merchant = $2`,
		r.PathValue("id"), merchantFrom(r.Context())).Scan(&p.ID, &p.AmountCents, &p.Currency, &p.ChargeID, &p.RefundedCents, &p.CreatedAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		writeProblem(w, http.StatusNotFound, "no such payment", "")
	case err != nil:
		a.internal(w, r, "read payment", err)
	default:
		writeJSON(w, http.StatusOK, p)
	}
}

// listPayments answers the merchant's payments, oldest first, with their
// number in X-Total-Count.
func (a *api) listPayments(w http.ResponseWriter, r *http.Request) {
	rows, err := a.pool.Query(r.Context(), `
		SELECT id, amount_cents, currency, charge_id, refunded_cents, created_at
		FROM payments WHERE merchant = $1 ORDER BY created_at, id`, merchantFrom(r.Context()))
	if err != nil {
		a.internal(w, r, "list payments", err)
		return
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Payment, error) {
		var p Payment
		err := row.Scan(&p.ID, &p.AmountCents, &p.Currency, &p.ChargeID, &p.RefundedCents, &p.CreatedAt)
		return p, err
	})
	if err != nil {
		a.internal(w, r, "list payments", err)
		return
	}
	if list == nil {
		list = []Payment{}
	}
	w.Header().Set("X-Total-Count", strconv.Itoa(len(list)))
	writeJSON(w, http.StatusOK, list)
}

var currencyCode = regexp.MustCompile(`^[a-z]{3}$`)

func (req paymentRequest) validate() error {
	switch {
	case req.AmountCents <= 0:
		return errors.New("amount_cents must be a positive number of cents")
	case !currencyCode.MatchString(req.Currency):
		return errors.New("currency must be a lowercase ISO 4217 code, such as eur")
	case req.CardToken == "":
		return errors.New("card_token is required")
	}
	return nil
}

// maxBody bounds a request body: idemhttp refuses larger ones first.
const maxBody = 64 << 10

// decode reads a JSON body into v, refusing unknown fields and trailing
// data.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the body is not the JSON object expected: %w", err)
	}
	if dec.More() {
		return errors.New("the body holds more than one JSON object")
	}
	return nil
}

// invalid answers 400 for a request refused before any work: idem stores
// nothing, so the client may correct it and send it again with the same
// key.
func invalid(w http.ResponseWriter, r *http.Request, err error) {
	idem.NotExecuted(r.Context())
	writeProblem(w, http.StatusBadRequest, "invalid request", err.Error())
}

// Merchants: the API's callers, named by their bearer token. A real API
// would look the token up; the example takes it as the merchant's name.
type merchantKey struct{}

var merchantName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// authenticate refuses requests without a merchant, and puts the merchant
// in the request's context for the handlers and for idemhttp's TenantFunc.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || !merchantName.MatchString(token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			writeProblem(w, http.StatusUnauthorized, "unauthenticated", "send Authorization: Bearer <merchant>")
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), merchantKey{}, token)))
	})
}

func merchantFrom(ctx context.Context) string {
	m, _ := ctx.Value(merchantKey{}).(string)
	return m
}

// tenant is idemhttp's TenantFunc: each merchant has its own key space.
func tenant(r *http.Request) (string, error) {
	if m := merchantFrom(r.Context()); m != "" {
		return m, nil
	}
	return "", errors.New("no authenticated merchant")
}

func newID(prefix string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the API's own types always encode
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeProblem answers an RFC 9457 problem.
func writeProblem(w http.ResponseWriter, status int, title, detail string) {
	b, _ := json.Marshal(struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail,omitempty"`
	}{"about:blank", title, status, detail})
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
