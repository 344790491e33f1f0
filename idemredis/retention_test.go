package idemredis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestRetentionTTL: the record's TTL is its retention; past it the key is
// gone, Get says ErrNotFound and a claim runs afresh. Purge has nothing to
// do.
func TestRetentionTTL(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	p := idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), Token: 1, Lease: 100 * time.Millisecond, Retention: 300 * time.Millisecond}
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	ttl, err := s.client.PTTL(ctx, s.key("t", "k")).Result()
	if err != nil || ttl <= 0 || ttl > 300*time.Millisecond {
		t.Fatalf("PTTL = %v %v, want in (0, 300ms]", ttl, err)
	}
	tx, _ := s.Begin(ctx)
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1, Result: idem.Result{Status: 201}}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil || rec.ExpiresAt.Sub(rec.CreatedAt) != 300*time.Millisecond {
		t.Fatalf("record %+v %v, want expires_at = created_at + 300ms", rec, err)
	}
	if n, err := s.Purge(ctx, idem.PurgeParams{}); n != 0 || err != nil {
		t.Fatalf("Purge = %d %v, want 0", n, err)
	}
	time.Sleep(400 * time.Millisecond)
	if _, err := s.Get(ctx, "t", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get past retention: %v, want ErrNotFound", err)
	}
	p.Token = 2
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim past retention: %+v %v", r, err)
	}
}

// TestStoredExpiryIsChecked: a record whose stored expires_at has passed
// counts as absent even while its key is still there (the TTL is rounded
// up to the millisecond, and outlives the retention while a lease runs):
// the claim wins, even with another fingerprint under a valid lease, and
// the old token can then neither extend nor complete.
func TestStoredExpiryIsChecked(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	p := idem.ClaimParams{Tenant: "t", Key: "k", Fingerprint: []byte("fp"), Token: 1, Lease: time.Hour, Retention: time.Hour}
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	past := time.Now().Add(-time.Hour).UnixMicro()
	if err := s.client.HSet(ctx, s.key("t", "k"), "expires_at", past).Err(); err != nil {
		t.Fatal(err)
	}
	p.Token, p.Fingerprint = 2, []byte("other")
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim past stored retention: %+v %v", r, err)
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil || rec.LeaseToken != 2 || string(rec.Fingerprint) != "other" || !rec.ExpiresAt.After(time.Now()) {
		t.Fatalf("fresh record: %+v %v", rec, err)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Hour}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("extend by the expired holder: %v, want ErrLeaseLost", err)
	}
	tx, _ := s.Begin(ctx)
	if err := tx.Complete(ctx, idem.CompleteParams{Tenant: "t", Key: "k", Token: 1}); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("complete by the expired holder: %v, want ErrLeaseLost", err)
	}
}

// TestShortRetentionKeepsHeldRecord: with a retention shorter than the
// lease, the key counts as absent past the retention, but Redis keeps the
// record while the lease runs: its TTL is the later of the two.
func TestShortRetentionKeepsHeldRecord(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	p := idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: 100 * time.Millisecond}
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	ttl, err := s.client.PTTL(ctx, s.key("t", "k")).Result()
	if err != nil || ttl < 50*time.Second {
		t.Fatalf("PTTL = %v %v, want about the lease (a minute)", ttl, err)
	}
}

// TestExtendKeepsRetention: Extend never lets the retention, and so the
// TTL, end before the lease.
func TestExtendKeepsRetention(t *testing.T) {
	ctx := context.Background()
	s := newStore(t)
	p := idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: 100 * time.Millisecond, Retention: 200 * time.Millisecond}
	if r, err := s.Claim(ctx, p); err != nil || !r.Won {
		t.Fatalf("claim: %+v %v", r, err)
	}
	if err := s.Extend(ctx, idem.ExtendParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "t", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ExpiresAt.Before(rec.LockedUntil) || rec.LockedUntil.Sub(rec.CreatedAt) < time.Minute {
		t.Fatalf("after Extend: locked_until %v expires_at %v created_at %v", rec.LockedUntil, rec.ExpiresAt, rec.CreatedAt)
	}
	ttl, err := s.client.PTTL(ctx, s.key("t", "k")).Result()
	if err != nil || ttl < 50*time.Second {
		t.Fatalf("PTTL after Extend = %v %v, want about a minute", ttl, err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := s.Get(ctx, "t", "k"); err != nil {
		t.Fatalf("record gone at its first retention although its lease runs: %v", err)
	}
}
