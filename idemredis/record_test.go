package idemredis

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestRecordRoundTrip: every field of a result, binary bodies and
// fingerprints included, comes back from Get and from a lost claim as it
// was stored.
func TestRecordRoundTrip(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if _, err := s.Get(ctx, "t", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get of a missing key: %v, want ErrNotFound", err)
	}
	fp := []byte{0, 1, 2, 0xff, 0}
	claimed := time.Now()
	if r, err := s.Claim(ctx, idem.ClaimParams{Tenant: "tenant:1", Key: "k", Fingerprint: fp, Token: -42, Lease: time.Minute, Retention: time.Hour}); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	rec, err := s.Get(ctx, "tenant:1", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateInFlight || rec.LeaseToken != -42 || !reflect.DeepEqual(rec.Fingerprint, fp) || !rec.CompletedAt.IsZero() {
		t.Fatalf("in-flight record: %+v", rec)
	}
	// The server's clock, not ours; they are one machine here, so they
	// agree within the test's run time.
	if d := rec.CreatedAt.Sub(claimed); d < -time.Minute || d > time.Minute {
		t.Fatalf("created_at %v far from %v", rec.CreatedAt, claimed)
	}
	if rec.LockedUntil.Sub(rec.CreatedAt) != time.Minute || rec.ExpiresAt.Sub(rec.CreatedAt) != time.Hour {
		t.Fatalf("lease or retention not counted from the claim: %+v", rec)
	}

	for _, res := range []idem.Result{
		{Mode: idem.ModeResponse, Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "Location": {"/orders/1"}}, Body: []byte("{\"id\":1}\x00\xff")},
		{Mode: idem.ModeReference, Status: 201, Reference: "order_1"},
		{Mode: idem.ModeMarker, Status: 204},
	} {
		key := "k-" + res.Mode.String()
		if r, err := s.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: key, Fingerprint: fp, Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil || !r.Won {
			t.Fatalf("claim: %+v %v", r, err)
		}
		tx, _ := s.Begin(ctx)
		if got := tx.Context(ctx); got != ctx {
			t.Fatal("Tx.Context must return ctx unchanged")
		}
		if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: key, Token: 1, Result: res}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("Rollback after Complete: %v", err)
		}
		rec, err := s.Get(ctx, "t", key)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != idem.StateComplete || !reflect.DeepEqual(rec.Result, res) || rec.CompletedAt.Before(rec.CreatedAt) {
			t.Fatalf("stored %+v, want result %+v", rec, res)
		}
		lost, err := s.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: key, Fingerprint: fp, Token: 2, Lease: time.Minute, Retention: time.Hour})
		if err != nil || lost.Won || !reflect.DeepEqual(lost.Record, rec) {
			t.Fatalf("lost claim returned %+v %v, want %+v", lost.Record, err, rec)
		}
	}
}

// TestCompleteRefusesUnknownMode: a result the decoder could not read back
// is refused before it is stored.
func TestCompleteRefusesUnknownMode(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	if _, err := s.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tx, _ := s.Begin(ctx)
	err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Mode: 9}})
	if err == nil || errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete with mode 9: %v", err)
	}
	if rec, err := s.Get(ctx, "t", "k"); err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("record after a refused completion: %+v %v", rec, err)
	}
}

// TestDecodeRefusesDamagedRecords: a hash this package could not have
// written is an error, not a half-read replay.
func TestDecodeRefusesDamagedRecords(t *testing.T) {
	good := map[string]string{
		"tenant": "t", "key": "k", "state": "complete", "token": "1",
		"locked_until": "1", "created_at": "1", "expires_at": "2", "completed_at": "1",
		"mode": "response", "status": "200", "header": `{"Content-Type":["text/plain"]}`,
	}
	if _, err := decodeRecord(good); err != nil {
		t.Fatalf("good record: %v", err)
	}
	for field, value := range map[string]string{
		"state": "done", "token": "x", "expires_at": "", "mode": "unknown", "status": "",
		"header": `{"Bad Name":["v"]}`, "completed_at": "soon",
	} {
		bad := make(map[string]string, len(good))
		for k, v := range good {
			bad[k] = v
		}
		bad[field] = value
		if _, err := decodeRecord(bad); err == nil {
			t.Errorf("record with %s=%q decoded without error", field, value)
		}
	}
}
