package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/examples/payments/cardnet"
	"github.com/idem-go/idem/idemclient"
)

// TestClientTimeoutsEveryDefault is the double charge of a client that
// gives up too early: 40 payments, sent at once, from clients that give
// up on an attempt after 100ms and retry with the same key, to an API
// whose card calls take 60 to 140ms, on idem's and idemhttp's defaults.
// Most first attempts give up while the card is being charged. Each
// payment must move money once, leave one row and a stored answer, and
// the client must get that answer; then the same for 39 refunds.
func TestClientTimeoutsEveryDefault(t *testing.T) {
	db := database(t)
	network, cardURL := startNetwork(t, nil)
	base := startAPI(t, serverConfig{db: db.url, cardURL: cardURL})
	merchant := "m_" + randomHex(4)
	client := idemclient.NewClient(&idemclient.Transport{AttemptTimeout: 100 * time.Millisecond, MaxAttempts: 50})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	calls := paymentCalls(merchant, "pay", 40)
	results := sendAll(ctx, client, base, calls)
	t.Logf("40 payments: %s", summarize(results))
	paid := checkExactlyOnce(t, db, network, merchant, paymentsKind, calls, results)
	checkRanOnce(t, network, "/v1/charges", calls, results, paid)

	var refunds []apiCall
	for _, c := range calls[:39] {
		p, ok := paid[c.key]
		if !ok {
			continue
		}
		amount := c.body.(paymentRequest).AmountCents
		refunds = append(refunds, apiCall{
			path: "/payments/" + p.id + "/refunds", merchant: merchant,
			key: "refund-" + c.key, body: refundRequest{AmountCents: amount},
		})
	}
	results = sendAll(ctx, client, base, refunds)
	t.Logf("%d refunds: %s", len(refunds), summarize(results))
	refunded := checkExactlyOnce(t, db, network, merchant, refundsKind, refunds, results)
	checkRanOnce(t, network, "/v1/refunds", refunds, results, refunded)

	// The last payment was not refunded, the others wholly.
	rows, err := db.pool.Query(ctx, `SELECT id, amount_cents, refunded_cents FROM payments WHERE merchant = $1`, merchant)
	if err != nil {
		t.Fatal(err)
	}
	left := map[string]int64{}
	for rows.Next() {
		var id string
		var amount, refundedCents int64
		if err := rows.Scan(&id, &amount, &refundedCents); err != nil {
			t.Fatal(err)
		}
		left[id] = amount - refundedCents
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for i, c := range calls {
		want := int64(0)
		if i == len(calls)-1 {
			want = c.body.(paymentRequest).AmountCents
		}
		if got := left[paid[c.key].id]; got != want {
			t.Errorf("%s: %d cents left to refund, want %d", c.key, got, want)
		}
	}
}

// checkRanOnce checks that no operation ran twice: the network received
// one call per downstream key (a second call, even one the network
// answers from its own key, means the handler ran again). It also checks
// that the test did what it says: clients gave up on attempts, and got
// the stored answer afterwards.
func checkRanOnce(t *testing.T, network *cardnet.Network, path string, calls []apiCall, results []callResult, ops map[string]outcome) {
	t.Helper()
	perKey := map[string]int{}
	for _, c := range network.Calls() {
		if c.Path == path {
			perKey[c.Key]++
		}
	}
	gaveUp, replayed := 0, 0
	for i, c := range calls {
		o, ok := ops[c.key]
		if !ok {
			continue
		}
		if n := perKey[o.downstream]; n != 1 {
			t.Errorf("%s: the card network was called %d times under its downstream key: the handler ran again (attempts: %s)", c.key, n, history(results[i]))
		}
		if results[i].timeouts() > 0 {
			gaveUp++
			if results[i].trace.Replayed {
				replayed++
			}
		}
	}
	// A retry may also run first, when its server had not yet taken up
	// the attempt that gave up: a fresh answer after a timeout is no
	// second execution in itself. The calls above tell.
	if gaveUp == 0 || replayed == 0 {
		t.Errorf("%d clients gave up on an attempt, %d of them got a replay: the test did not exercise what it is about", gaveUp, replayed)
	}
}

func history(r callResult) string {
	s := ""
	for i, a := range r.trace.History {
		if i > 0 {
			s += " "
		}
		switch {
		case a.Err != nil:
			s += "error"
		case a.Replayed:
			s += fmt.Sprintf("%d(replay)", a.Status)
		default:
			s += fmt.Sprint(a.Status)
		}
	}
	return s
}

// TestDeclinedAndInvalid: a declined card answers 402, stored (a retry
// gets it again and the card is not tried again), and leaves no row; an
// invalid payment answers 400, not stored, so that the corrected request
// runs under the same key.
func TestDeclinedAndInvalid(t *testing.T) {
	db := database(t)
	network, cardURL := startNetwork(t, &cardnet.Config{MinLatency: time.Millisecond, MaxLatency: 2 * time.Millisecond})
	base := startAPI(t, serverConfig{db: db.url, cardURL: cardURL})
	merchant := "m_" + randomHex(4)
	client := idemclient.NewClient(nil)
	ctx := context.Background()

	declined := apiCall{path: "/payments", merchant: merchant, key: "declined-" + randomHex(4),
		body: paymentRequest{AmountCents: 500, Currency: "eur", CardToken: cardnet.DeclinedToken}}
	for i := range 2 {
		r := sendAll(ctx, client, base, []apiCall{declined})[0]
		if r.err != nil || r.status != http.StatusPaymentRequired || r.trace.Replayed != (i == 1) {
			t.Fatalf("declined card, attempt %d: %d %v replayed=%v, want 402 (a replay the second time)", i+1, r.status, r.err, r.trace.Replayed)
		}
	}
	calls := network.Calls()
	if len(calls) != 1 || len(network.Movements()) != 0 {
		t.Errorf("declined card: %d calls to the network, %d movements; want 1 call and none", len(calls), len(network.Movements()))
	}

	invalid := apiCall{path: "/payments", merchant: merchant, key: "invalid-" + randomHex(4),
		body: paymentRequest{AmountCents: -5, Currency: "eur", CardToken: "tok_visa"}}
	r := sendAll(ctx, client, base, []apiCall{invalid})[0]
	if r.err != nil || r.status != http.StatusBadRequest {
		t.Fatalf("invalid payment: %d %v, want 400", r.status, r.err)
	}
	// The corrected request, under the same key, runs.
	invalid.body = paymentRequest{AmountCents: 5, Currency: "eur", CardToken: "tok_visa"}
	r = sendAll(ctx, client, base, []apiCall{invalid})[0]
	if r.err != nil || r.status != http.StatusCreated || r.trace.Replayed {
		t.Fatalf("corrected payment under the same key: %d %v replayed=%v, want a fresh 201", r.status, r.err, r.trace.Replayed)
	}

	var rows int
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM payments WHERE merchant = $1`, merchant).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Errorf("%d payment rows, want 1 (the corrected payment; none for the declined card)", rows)
	}
	recs := records(t, db.pool, merchant)
	if rec := recs[declined.key]; rec.state != "complete" || rec.status != http.StatusPaymentRequired {
		t.Errorf("declined card: idem's record is %s %d, want complete 402", rec.state, rec.status)
	}
}
