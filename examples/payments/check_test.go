package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"

	"github.com/idem-go/idem/examples/payments/cardnet"
)

// opKind is what the checks need to know of payments or of refunds.
type opKind struct {
	step     string // the idem.Step name, also the network's movement kind but for refunds
	movement string // cardnet.Movement.Kind
	// rows lists the merchant's rows: their id and the network's id.
	rows string
	// answer reads a 201 answer: the row's id and the network's id.
	answer func(body []byte) (id, networkID string, err error)
}

var (
	paymentsKind = opKind{
		step: "charge", movement: "charge",
		rows: `SELECT id, charge_id FROM payments WHERE merchant = $1`,
		answer: func(b []byte) (string, string, error) {
			var p Payment
			err := json.Unmarshal(b, &p)
			return p.ID, p.ChargeID, err
		},
	}
	refundsKind = opKind{
		step: "refund", movement: "refund",
		rows: `SELECT r.id, r.network_id FROM refunds r JOIN payments p ON p.id = r.payment_id WHERE p.merchant = $1`,
		answer: func(b []byte) (string, string, error) {
			var r Refund
			err := json.Unmarshal(b, &r)
			return r.ID, r.NetworkID, err
		},
	}
)

// outcome is what the checks found for one operation.
type outcome struct {
	id, networkID string
	downstream    string // the downstream key the network saw
}

// checkExactlyOnce checks that every operation in calls (all of kind k,
// all of merchant, and every such operation the network ever received)
// was answered 201, moved money exactly once at the network under its
// downstream key, left exactly one row, the one its answer names, and
// left a complete idem record holding the very answer the client got (no
// row without its stored answer) and the recorded step. It returns the outcomes by key.
func checkExactlyOnce(t *testing.T, db testDB, network *cardnet.Network, merchant string, k opKind, calls []apiCall, results []callResult) map[string]outcome {
	t.Helper()
	out := map[string]outcome{}
	for i, c := range calls {
		r := results[i]
		if r.err != nil || r.status != http.StatusCreated {
			t.Errorf("%s: got %d %v (%s) after %d attempts, want 201", c.key, r.status, r.err, bytes.TrimSpace(r.body), r.trace.Attempts)
			continue
		}
		id, nid, err := k.answer(r.body)
		if err != nil || id == "" || nid == "" {
			t.Errorf("%s: answer %s: %v", c.key, r.body, err)
			continue
		}
		out[c.key] = outcome{id: id, networkID: nid, downstream: downstreamKey(t, c, k.step)}
	}

	// The network: as many movements as operations, each operation's
	// under its downstream key, and the one its answer names.
	var moved []cardnet.Movement
	for _, m := range network.Movements() {
		if m.Kind == k.movement {
			moved = append(moved, m)
		}
	}
	if len(moved) != len(calls) {
		t.Errorf("the card network moved money %d times (%s) for %d operations", len(moved), k.movement, len(calls))
	}
	byKey := map[string][]cardnet.Movement{}
	for _, m := range moved {
		byKey[m.Key] = append(byKey[m.Key], m)
	}
	for key, o := range out {
		ms := byKey[o.downstream]
		if len(ms) != 1 || ms[0].ID != o.networkID {
			t.Errorf("%s: the card network moved money %d times under its downstream key (%v); the answer names %s", key, len(ms), ms, o.networkID)
		}
	}

	// The rows: one per operation, the one its answer names.
	rows, err := db.pool.Query(context.Background(), k.rows, merchant)
	if err != nil {
		t.Fatal(err)
	}
	rowNetwork := map[string]string{}
	for rows.Next() {
		var id, nid string
		if err := rows.Scan(&id, &nid); err != nil {
			t.Fatal(err)
		}
		rowNetwork[id] = nid
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(rowNetwork) != len(calls) {
		t.Errorf("%d rows for %d operations", len(rowNetwork), len(calls))
	}
	for key, o := range out {
		if nid, ok := rowNetwork[o.id]; !ok || nid != o.networkID {
			t.Errorf("%s: the answer names row %s (network id %s); the row holds %q (found: %v)", key, o.id, o.networkID, nid, ok)
		}
	}

	// idem's records: complete, each holding the answer its client got.
	recs := records(t, db.pool, merchant)
	for i, c := range calls {
		if _, ok := out[c.key]; !ok {
			continue
		}
		rec := recs[c.key]
		if rec.state != "complete" || rec.status != http.StatusCreated || !bytes.Equal(rec.body, results[i].body) {
			t.Errorf("%s: idem's record is %s %d %q; the client got %s", c.key, rec.state, rec.status, rec.body, results[i].body)
		}
		if !rec.hasSteps {
			t.Errorf("%s: idem's record holds no recovery point: the %s was not recorded with idem.Step", c.key, k.step)
		}
	}
	for key, rec := range recs {
		if rec.state != "complete" {
			t.Errorf("%s: idem's record is still %s", key, rec.state)
		}
	}
	return out
}

// paymentCalls are n payments of merchant, each under a key of its own.
func paymentCalls(merchant, prefix string, n int) []apiCall {
	calls := make([]apiCall, n)
	for i := range calls {
		calls[i] = apiCall{
			path: "/payments", merchant: merchant,
			key:  fmt.Sprintf("%s-%02d-%s", prefix, i, randomHex(4)),
			body: paymentRequest{AmountCents: int64(1000 + i), Currency: "eur", CardToken: "tok_visa"},
		}
	}
	return calls
}
