package idemmem_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TestHashCollision claims two pairs that one string of tenant, a NUL
// and key would confuse: ("a\x00b", "c") and ("a", "b\x00c"). Each must
// still be claimed, completed, read, released and purged as the distinct
// record it is.
func TestHashCollision(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := idemmem.NewStore(&idemmem.Config{NowFunc: func() time.Time { return now }})
	type pair struct{ tenant, key string }
	pairs := []pair{{"a\x00b", "c"}, {"a", "b\x00c"}}
	for i, p := range pairs {
		res, err := s.Claim(ctx, idem.ClaimParams{Tenant: p.tenant, Key: p.key, Fingerprint: []byte{byte(i)},
			Token: int64(i + 1), Lease: time.Minute, Retention: time.Hour})
		if err != nil || !res.Won {
			t.Fatalf("claim %q: won=%v err=%v", p, res.Won, err)
		}
	}
	if n := s.Len(); n != len(pairs) {
		t.Fatalf("Len = %d, want %d", n, len(pairs))
	}
	tx, _ := s.Begin(ctx)
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "a", Key: "b\x00c", Token: 2,
		Result: idem.Result{Status: 201, Body: []byte("second")}}); err != nil {
		t.Fatal(err)
	}
	for i, p := range pairs {
		rec, err := s.Get(ctx, p.tenant, p.key)
		if err != nil {
			t.Fatalf("get %q: %v", p, err)
		}
		if rec.Tenant != p.tenant || rec.Key != p.key || rec.LeaseToken != int64(i+1) {
			t.Fatalf("get %q: got the record of (%q, %q) token %d", p, rec.Tenant, rec.Key, rec.LeaseToken)
		}
		if wantComplete := i == 1; (rec.State == idem.StateComplete) != wantComplete {
			t.Fatalf("get %q: state %s", p, rec.State)
		}
	}
	// Release the first, then purge the second.
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: "a\x00b", Key: "c", Token: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a\x00b", "c"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("get after release: %v", err)
	}
	if rec, err := s.Get(ctx, "a", "b\x00c"); err != nil || string(rec.Result.Body) != "second" {
		t.Fatalf("survivor: %v %v", rec, err)
	}
	now = now.Add(2 * time.Hour)
	if n, err := s.Purge(ctx, idem.PurgeParams{}); err != nil || n != 1 {
		t.Fatalf("purge = %d, %v; want 1", n, err)
	}
	if n := s.Len(); n != 0 {
		t.Fatalf("Len after purge = %d", n)
	}
}
