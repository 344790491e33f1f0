package cardnet

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"
)

func fastNetwork(t *testing.T) (*Network, *Client) {
	t.Helper()
	n := New(&Config{MinLatency: 20 * time.Millisecond, MaxLatency: 40 * time.Millisecond})
	srv := httptest.NewServer(n)
	t.Cleanup(srv.Close)
	return n, &Client{URL: srv.URL}
}

var visa = ChargeRequest{AmountCents: 1500, Currency: "eur", CardToken: "tok_visa"}

// Calls with one key, at the same instant: one charge, one movement,
// every caller told of the same charge.
func TestSameKeyOneCharge(t *testing.T) {
	n, c := fastNetwork(t)
	const callers = 10
	ids := make([]string, callers)
	errs := make([]error, callers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ch, err := c.Charge(context.Background(), "k1", visa)
			ids[i], errs[i] = ch.ID, err
		}()
	}
	close(start)
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || ids[i] == "" || ids[i] != ids[0] {
			t.Fatalf("caller %d: %q, %v; caller 0: %q", i, ids[i], errs[i], ids[0])
		}
	}
	if m := n.Movements(); len(m) != 1 || m[0].Key != "k1" || m[0].ID != ids[0] {
		t.Errorf("movements: %+v, want one, of charge %s under k1", m, ids[0])
	}
	if calls := n.Calls(); len(calls) != callers {
		t.Errorf("%d calls counted, want %d", len(calls), callers)
	}
}

// Without a key every call is a charge of its own, as at a real network.
func TestNoKeyChargesEachTime(t *testing.T) {
	n, c := fastNetwork(t)
	for range 3 {
		if _, err := c.Charge(context.Background(), "", visa); err != nil {
			t.Fatal(err)
		}
	}
	if m := n.Movements(); len(m) != 3 {
		t.Errorf("%d movements, want 3", len(m))
	}
}

func TestKeyReusedDeclinedRefunds(t *testing.T) {
	n, c := fastNetwork(t)
	ctx := context.Background()
	ch, err := c.Charge(ctx, "k", visa)
	if err != nil {
		t.Fatal(err)
	}
	other := visa
	other.AmountCents++
	var ce *CallError
	if _, err := c.Charge(ctx, "k", other); !errors.As(err, &ce) || ce.Status != http.StatusUnprocessableEntity || IsUnknownOutcome(err) {
		t.Errorf("same key, another amount: %v, want a 422", err)
	}

	declined, err := c.Charge(ctx, "d", ChargeRequest{AmountCents: 100, Currency: "eur", CardToken: DeclinedToken})
	if err != nil || declined.Status != "declined" || declined.DeclineCode == "" {
		t.Errorf("declined card: %+v, %v", declined, err)
	}

	if _, err := c.Refund(ctx, "r1", RefundRequest{ChargeID: ch.ID, AmountCents: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Refund(ctx, "r2", RefundRequest{ChargeID: ch.ID, AmountCents: 501}); !errors.As(err, &ce) || ce.Code != "amount_too_large" {
		t.Errorf("refund past the charge: %v, want amount_too_large", err)
	}
	if _, err := c.Refund(ctx, "r3", RefundRequest{ChargeID: "ch_nope", AmountCents: 1}); !errors.As(err, &ce) || ce.Status != http.StatusNotFound {
		t.Errorf("refund of an unknown charge: %v, want 404", err)
	}
	if m := n.Movements(); len(m) != 2 {
		t.Errorf("movements %+v, want the charge and one refund", m)
	}
}

// A caller that gives up mid-call does not stop the charge: the money
// moves, and a call with the same key learns of it.
func TestCallerGoneChargeStands(t *testing.T) {
	n := New(&Config{MinLatency: 200 * time.Millisecond, MaxLatency: 200 * time.Millisecond})
	srv := httptest.NewServer(n)
	defer srv.Close()
	c := &Client{URL: srv.URL}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c.Charge(ctx, "k", visa); !IsUnknownOutcome(err) {
		t.Fatalf("a call cut short: %v, want an unknown outcome", err)
	}
	ch, err := c.Charge(context.Background(), "k", visa)
	if err != nil {
		t.Fatal(err)
	}
	if m := n.Movements(); len(m) != 1 || m[0].ID != ch.ID {
		t.Errorf("movements %+v, want one: charge %s", m, ch.ID)
	}
}
