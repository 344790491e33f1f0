package idemmem_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func claimFor(t *testing.T, s *idemmem.Store, key string, lease time.Duration) idem.ClaimParams {
	t.Helper()
	p := idem.ClaimParams{Tenant: "t", Key: key, Token: 7, Lease: lease, Retention: 24 * time.Hour}
	if res, err := s.Claim(context.Background(), p); err != nil || !res.Won {
		t.Fatalf("Claim = %+v, %v; want won", res, err)
	}
	return p
}

// The end of a lease is no call, yet a waiter must hear of it: the
// holder died and the key may be taken over.
func TestWatchLeaseEnd(t *testing.T) {
	s := idemmem.NewStore(nil)
	p := claimFor(t, s, "k", 50*time.Millisecond)
	changed, stop, err := s.Watch(context.Background(), p.Tenant, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch's channel still open long after the lease ended")
	}
}

// A heartbeat moves the end of the lease: the waiters are not woken at
// the end it replaced.
func TestWatchHeartbeatMovesLeaseEnd(t *testing.T) {
	const lease = 2 * time.Second
	s := idemmem.NewStore(nil)
	p := claimFor(t, s, "k", lease)
	changed, stop, err := s.Watch(context.Background(), p.Tenant, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := s.Extend(context.Background(), idem.ExtendParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
		t.Fatal("Watch's channel closed at the end of a lease that a heartbeat had moved")
	case <-time.After(lease + 500*time.Millisecond):
	}
}

// A takeover is a change: the execution waited on is gone. The store's
// clock jumps past the lease, so that only the takeover can close the
// channel (the lease's timer runs on the real clock).
func TestWatchTakeover(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	s := idemmem.NewStore(&idemmem.Config{NowFunc: func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}})
	p := claimFor(t, s, "k", time.Hour)
	changed, stop, err := s.Watch(context.Background(), p.Tenant, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mu.Lock()
	now = now.Add(2 * time.Hour)
	mu.Unlock()
	p.Token = 8
	if res, err := s.Claim(context.Background(), p); err != nil || !res.Won {
		t.Fatalf("takeover Claim = %+v, %v; want won", res, err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch's channel still open after a takeover")
	}
}

// Watching a record that is not in flight answers at once: nothing to
// wait for.
func TestWatchNothingInFlight(t *testing.T) {
	s := idemmem.NewStore(nil)
	changed, stop, err := s.Watch(context.Background(), "t", "absent")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	select {
	case <-changed:
	default:
		t.Fatal("Watch of an absent record returned an open channel")
	}
}

// A release that keeps the record for its recovery points ends its lease:
// the waiters hear of it at once, not at the end of the lease it had.
func TestWatchReleaseWithSteps(t *testing.T) {
	s := idemmem.NewStore(nil)
	p := claimFor(t, s, "k", time.Hour)
	ctx := context.Background()
	if err := s.SaveStep(ctx, idem.SaveStepParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token, Name: "charge", Value: []byte("ch_1")}); err != nil {
		t.Fatal(err)
	}
	changed, stop, err := s.Watch(ctx, p.Tenant, p.Key)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := s.Release(ctx, idem.ReleaseParams{Tenant: p.Tenant, Key: p.Key, Token: p.Token}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("Watch's channel still open after a release that ended the lease")
	}
}
