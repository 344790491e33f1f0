package main

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
	"github.com/idem-go/idem/examples/payments/cardnet"
)

// TestOptingOutIsVisible runs `idem check` (its library) against the
// payments API twice: on idemhttp's defaults, and opted out with
// -cancel-on-disconnect. The count is the card network's charge calls: a
// charge the handler made again, even one the network then answered from
// its own idempotency key, is the payment run again. Check 6 cuts a
// payment's connection while its card is being charged and retries with
// the same key: the default API lets the charge finish and replays its
// answer; the opted-out one cancels the handler, releases the key, and
// charges again on the retry.
func TestOptingOutIsVisible(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: runs idem check twice against slow card calls (-short)")
	}
	db := database(t)
	for _, tc := range []struct {
		name      string
		optOut    bool
		wantCheck idemcheck.Status
	}{
		{"defaults", false, idemcheck.Pass},
		{"cancel-on-disconnect", true, idemcheck.Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Card calls of 400 to 500ms, cut 250ms after the request was
			// sent: the payment has claimed its key and is in its card
			// call, on a loaded machine too.
			network, cardURL := startNetwork(t, &cardnet.Config{MinLatency: 400 * time.Millisecond, MaxLatency: 500 * time.Millisecond})
			base := startAPI(t, serverConfig{db: db.url, cardURL: cardURL, cancelOnDisconnect: tc.optOut})
			merchant := "m_" + randomHex(4)
			rep, err := idemcheck.Check(context.Background(), idemcheck.Config{
				URL:  base + "/payments",
				Body: []byte(`{"amount_cents":1999,"currency":"eur","card_token":"tok_visa"}`),
				Header: http.Header{
					"Content-Type":  {"application/json"},
					"Authorization": {"Bearer " + merchant},
				},
				CountURL:        cardURL + "/v1/calls?path=/v1/charges",
				DisconnectAfter: 250 * time.Millisecond,
				Settle:          time.Second,
			})
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			idemcheck.WriteReport(&out, rep)
			t.Logf("idem check:\n%s", out.String())
			for _, r := range rep.Results {
				want := idemcheck.Pass
				if r.ID == 6 {
					want = tc.wantCheck
				}
				if r.Status != want {
					t.Errorf("check %d (%s): %s, want %s: %s", r.ID, r.Name, r.Status, want, r.Evidence)
				}
			}
			if rep.Passed != (tc.wantCheck == idemcheck.Pass) {
				t.Errorf("report passed: %v", rep.Passed)
			}

			// Either way the card network moved money once per payment:
			// the retry's charge carried the same downstream key.
			perKey := map[string]int{}
			for _, m := range network.Movements() {
				perKey[m.Key]++
			}
			for key, n := range perKey {
				if n != 1 {
					t.Errorf("the card network moved money %d times under one downstream key (%.8s…)", n, key)
				}
			}
			rows := 0
			if err := db.pool.QueryRow(context.Background(), `SELECT count(*) FROM payments WHERE merchant = $1`, merchant).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != len(perKey) {
				t.Errorf("%d payment rows for %d charges", rows, len(perKey))
			}
		})
	}
}
