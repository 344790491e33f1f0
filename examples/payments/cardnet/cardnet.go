// Package cardnet is the card network of the payments example: a real
// HTTP server that charges and refunds cards the way card networks and
// payment providers do, for the example to call and for its tests to
// count. It keeps everything in memory.
//
// Every call takes a while (Config.MinLatency to Config.MaxLatency, 60 to
// 140 ms by default), and moves the money halfway through, whether or not
// the caller is still listening: a caller that gives up on a call does not
// learn whether the card was charged.
//
// A call that carries an Idempotency-Key is one operation per key: the
// first call with a key runs it, and every later call with that key gets
// the same answer and moves no money (one that arrives while the first
// still runs waits for it). A call without a key is a new operation every
// time, as it is at a real network: retrying it charges the card again.
// The same key sent with another request is refused (422).
//
// The network counts what it does: Calls lists every call it received,
// Movements every movement of money, each with its key. GET /v1/calls and
// GET /v1/movements serve the same lists as JSON arrays with an
// X-Total-Count header, for a tool that counts from the outside
// (`idem check --count-url`).
package cardnet

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Default latencies of a call.
const (
	DefaultMinLatency = 60 * time.Millisecond
	DefaultMaxLatency = 140 * time.Millisecond
)

// DeclinedToken is the card token the network declines (402), as test
// card numbers do at real providers. Every other token is charged.
const DeclinedToken = "tok_chargeDeclined"

// Config configures a Network. The zero value means every default.
type Config struct {
	// MinLatency and MaxLatency bound how long a call takes, drawn
	// uniformly for each call. Default to 60ms and 140ms.
	MinLatency time.Duration
	MaxLatency time.Duration

	// ObserveFunc, when set, is called as each call arrives, moves money
	// and is answered, in the goroutine serving the call, before the
	// network goes on. Tests use it to act at a precise point of a call
	// (kill the caller while its card is being charged).
	ObserveFunc func(Event)
}

// EventKind says where a call stands in an Event.
type EventKind int

// The points of a call that ObserveFunc sees.
const (
	// Received: the call has arrived and been read.
	Received EventKind = iota
	// Moved: the call moved money (a charge or a refund succeeded). A
	// repeated call with a known key never gets here.
	Moved
	// Answered: the answer has been written to the caller (who may have
	// gone).
	Answered
)

// Event is a point of one call, for Config.ObserveFunc.
type Event struct {
	Kind EventKind
	Path string // /v1/charges or /v1/refunds
	Key  string // the call's Idempotency-Key, "" without one
	Call int    // the call's number, from 1, as in Calls
}

// Call is one call the network received.
type Call struct {
	N    int    `json:"n"`
	Path string `json:"path"`
	Key  string `json:"key,omitempty"`
}

// Movement is one movement of money: a charge or a refund that succeeded.
type Movement struct {
	N           int    `json:"n"`
	Kind        string `json:"kind"` // "charge" or "refund"
	ID          string `json:"id"`   // the charge's or the refund's id
	Key         string `json:"key,omitempty"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// ChargeRequest is the body of POST /v1/charges.
type ChargeRequest struct {
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	CardToken   string `json:"card_token"`
}

// Charge is the answer to POST /v1/charges: 201 when the card was
// charged (Status "succeeded"), 402 when it was declined (Status
// "declined", with DeclineCode).
type Charge struct {
	ID          string `json:"id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
	Status      string `json:"status"`
	DeclineCode string `json:"decline_code,omitempty"`
}

// RefundRequest is the body of POST /v1/refunds.
type RefundRequest struct {
	ChargeID    string `json:"charge_id"`
	AmountCents int64  `json:"amount_cents"`
}

// Refund is the answer to POST /v1/refunds (201).
type Refund struct {
	ID          string `json:"id"`
	ChargeID    string `json:"charge_id"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// Error is the body of an answer that moved no money and is not a
// decline: 400 (a request the network cannot run), 404 (an unknown
// charge), 422 (a key reused for another request).
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Network is the card network. It is an http.Handler; serve it with an
// http.Server (or httptest.Server). Its methods are safe for concurrent
// use.
type Network struct {
	config Config

	mu        sync.Mutex
	ops       map[string]*operation // by Idempotency-Key
	charges   map[string]*charge    // by id
	calls     []Call
	movements []Movement
}

// operation is what the network keeps of a key: the request it was first
// sent with and, once run, its answer.
type operation struct {
	fingerprint [sha256.Size]byte
	done        chan struct{} // closed once status and body are set
	status      int
	body        []byte
}

type charge struct {
	Charge
	refunded int64
}

// New returns a network. A nil config means every default.
func New(config *Config) *Network {
	n := &Network{ops: map[string]*operation{}, charges: map[string]*charge{}}
	if config != nil {
		n.config = *config
	}
	if n.config.MinLatency <= 0 {
		n.config.MinLatency = DefaultMinLatency
	}
	if n.config.MaxLatency <= 0 {
		n.config.MaxLatency = DefaultMaxLatency
	}
	n.config.MaxLatency = max(n.config.MaxLatency, n.config.MinLatency)
	return n
}

// maxBody bounds a request body: the network's requests are a few fields.
const maxBody = 64 << 10

// ServeHTTP serves POST /v1/charges, POST /v1/refunds, GET /v1/calls and
// GET /v1/movements.
func (n *Network) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodPost && (r.URL.Path == "/v1/charges" || r.URL.Path == "/v1/refunds"):
		n.serveCall(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/calls":
		path := r.URL.Query().Get("path")
		var out []Call
		for _, c := range n.Calls() {
			if path == "" || c.Path == path {
				out = append(out, c)
			}
		}
		writeList(w, out)
	case r.Method == http.MethodGet && r.URL.Path == "/v1/movements":
		kind := r.URL.Query().Get("kind")
		var out []Movement
		for _, m := range n.Movements() {
			if kind == "" || m.Kind == kind {
				out = append(out, m)
			}
		}
		writeList(w, out)
	default:
		writeJSON(w, http.StatusNotFound, Error{Code: "not_found", Message: "no such endpoint"})
	}
}

// serveCall runs one charge or refund. The caller's going away changes
// nothing: the call runs to its end, as it would at a real network.
func (n *Network) serveCall(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, Error{Code: "unreadable", Message: "the request body could not be read"})
		return
	}
	key := r.Header.Get("Idempotency-Key")
	path := r.URL.Path

	n.mu.Lock()
	n.calls = append(n.calls, Call{N: len(n.calls) + 1, Path: path, Key: key})
	callN := len(n.calls)
	n.mu.Unlock()
	n.observe(Event{Kind: Received, Path: path, Key: key, Call: callN})

	latency := n.config.MinLatency + rand.N(n.config.MaxLatency-n.config.MinLatency+1)
	time.Sleep(latency / 2)

	status, answer := n.run(path, key, body, callN)

	time.Sleep(latency - latency/2)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(answer)
	n.observe(Event{Kind: Answered, Path: path, Key: key, Call: callN})
}

// run runs the call's operation, or finds the answer of its key.
func (n *Network) run(path, key string, body []byte, callN int) (int, []byte) {
	if key == "" {
		return n.execute(path, key, body, callN)
	}
	fp := sha256.Sum256(append([]byte(path+"\n"), body...))
	n.mu.Lock()
	op := n.ops[key]
	if op == nil {
		op = &operation{fingerprint: fp, done: make(chan struct{})}
		n.ops[key] = op
		n.mu.Unlock()
		op.status, op.body = n.execute(path, key, body, callN)
		close(op.done)
		return op.status, op.body
	}
	n.mu.Unlock()
	if op.fingerprint != fp {
		return encode(http.StatusUnprocessableEntity, Error{Code: "idempotency_key_reused",
			Message: "this Idempotency-Key was used for another request"})
	}
	// A repeat: the first call's answer, once it has one. The first call
	// always ends (it waits on nothing), so this wait does too.
	<-op.done
	return op.status, op.body
}

// execute runs a charge or a refund: it moves the money or refuses.
func (n *Network) execute(path, key string, body []byte, callN int) (int, []byte) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if path == "/v1/charges" {
		var req ChargeRequest
		if err := dec.Decode(&req); err != nil {
			return encode(http.StatusBadRequest, Error{Code: "invalid_json", Message: "the body is not a charge request"})
		}
		return n.charge(req, key, callN)
	}
	var req RefundRequest
	if err := dec.Decode(&req); err != nil {
		return encode(http.StatusBadRequest, Error{Code: "invalid_json", Message: "the body is not a refund request"})
	}
	return n.refund(req, key, callN)
}

func (n *Network) charge(req ChargeRequest, key string, callN int) (int, []byte) {
	switch {
	case req.AmountCents <= 0:
		return encode(http.StatusBadRequest, Error{Code: "invalid_amount", Message: "amount_cents must be positive"})
	case len(req.Currency) != 3:
		return encode(http.StatusBadRequest, Error{Code: "invalid_currency", Message: "currency must be a three-letter code"})
	case req.CardToken == "":
		return encode(http.StatusBadRequest, Error{Code: "missing_card", Message: "card_token is required"})
	}
	n.mu.Lock()
	c := &charge{Charge: Charge{ID: newID("ch"), AmountCents: req.AmountCents, Currency: req.Currency, Status: "succeeded"}}
	if req.CardToken == DeclinedToken {
		c.Status, c.DeclineCode = "declined", "card_declined"
		n.mu.Unlock()
		return encode(http.StatusPaymentRequired, c.Charge)
	}
	n.charges[c.ID] = c
	n.movements = append(n.movements, Movement{N: len(n.movements) + 1, Kind: "charge", ID: c.ID, Key: key, AmountCents: c.AmountCents, Currency: c.Currency})
	n.mu.Unlock()
	n.observe(Event{Kind: Moved, Path: "/v1/charges", Key: key, Call: callN})
	return encode(http.StatusCreated, c.Charge)
}

func (n *Network) refund(req RefundRequest, key string, callN int) (int, []byte) {
	if req.AmountCents <= 0 {
		return encode(http.StatusBadRequest, Error{Code: "invalid_amount", Message: "amount_cents must be positive"})
	}
	n.mu.Lock()
	c := n.charges[req.ChargeID]
	switch {
	case c == nil:
		n.mu.Unlock()
		return encode(http.StatusNotFound, Error{Code: "no_such_charge", Message: "no charge has this id"})
	case c.refunded+req.AmountCents > c.AmountCents:
		n.mu.Unlock()
		return encode(http.StatusBadRequest, Error{Code: "amount_too_large",
			Message: fmt.Sprintf("%d cents are left to refund on this charge", c.AmountCents-c.refunded)})
	}
	c.refunded += req.AmountCents
	rf := Refund{ID: newID("re"), ChargeID: c.ID, AmountCents: req.AmountCents, Currency: c.Currency}
	n.movements = append(n.movements, Movement{N: len(n.movements) + 1, Kind: "refund", ID: rf.ID, Key: key, AmountCents: rf.AmountCents, Currency: rf.Currency})
	n.mu.Unlock()
	n.observe(Event{Kind: Moved, Path: "/v1/refunds", Key: key, Call: callN})
	return encode(http.StatusCreated, rf)
}

func (n *Network) observe(e Event) {
	if n.config.ObserveFunc != nil {
		n.config.ObserveFunc(e)
	}
}

// Calls returns every call received so far, in order.
func (n *Network) Calls() []Call {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Call(nil), n.calls...)
}

// Movements returns every movement of money so far, in order.
func (n *Network) Movements() []Movement {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Movement(nil), n.movements...)
}

// newID makes the id of a charge or a refund: random, as a network's ids
// are unique across its restarts.
func newID(prefix string) string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

func encode(status int, v any) (int, []byte) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // the network's own types always encode
	}
	return status, b
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	status, b := encode(status, v)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func writeList[T any](w http.ResponseWriter, list []T) {
	if list == nil {
		list = []T{}
	}
	w.Header().Set("X-Total-Count", strconv.Itoa(len(list)))
	writeJSON(w, http.StatusOK, list)
}

// Client calls a card network over HTTP.
type Client struct {
	// URL is the network's base URL, such as http://127.0.0.1:8081.
	URL string
	// HTTP sends the calls. Defaults to http.DefaultClient.
	HTTP *http.Client
}

// CallError is the error of a call the network answered with a status
// that is neither a success nor a decline.
type CallError struct {
	Status  int
	Code    string // Error.Code of the answer
	Message string // Error.Message of the answer
}

// Error says the status and what the network said.
func (e *CallError) Error() string {
	return fmt.Sprintf("card network: %d %s: %s", e.Status, e.Code, e.Message)
}

// Charge charges a card. key is sent as the Idempotency-Key: calls with
// the same key are one charge. A declined card is no error: it comes back
// with Status "declined". An error means the network refused the request
// (*CallError), or that its outcome is unknown (the call failed or timed
// out: the card may have been charged; call again with the same key to
// learn it).
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	var out Charge
	err := c.call(ctx, "/v1/charges", key, req, &out, http.StatusCreated, http.StatusPaymentRequired)
	return out, err
}

// Refund refunds (part of) a charge, under key as Charge does.
func (c *Client) Refund(ctx context.Context, key string, req RefundRequest) (Refund, error) {
	var out Refund
	err := c.call(ctx, "/v1/refunds", key, req, &out, http.StatusCreated)
	return out, err
}

func (c *Client) call(ctx context.Context, path, key string, in, out any, ok ...int) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return err
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			return json.Unmarshal(b, out)
		}
	}
	var e Error
	if json.Unmarshal(b, &e) != nil || e.Code == "" {
		e = Error{Code: "unexpected_answer", Message: http.StatusText(resp.StatusCode)}
	}
	return &CallError{Status: resp.StatusCode, Code: e.Code, Message: e.Message}
}

// IsUnknownOutcome reports whether err, from Charge or Refund, leaves the
// outcome unknown: no answer came (a connection error, a timeout), or the
// network failed (5xx). The money may have moved; only a call with the
// same key can tell.
func IsUnknownOutcome(err error) bool {
	if err == nil {
		return false
	}
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Status >= 500
	}
	return true
}
