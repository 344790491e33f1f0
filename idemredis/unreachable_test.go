package idemredis

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/redis/go-redis/v9"
)

// unreachableClient returns a client to a local port nobody listens on.
func unreachableClient(t *testing.T) *redis.Client {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // the port is now closed: connections are refused
	c := redis.NewClient(&redis.Options{
		Addr: addr, DialTimeout: 500 * time.Millisecond,
		MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestUnreachable: New still returns a store (with a warning), every
// operation returns an error, and the engine fails closed: the handler
// does not run and the error is a *idem.StoreError.
func TestUnreachable(t *testing.T) {
	ctx := context.Background()
	client := unreachableClient(t)
	var logs logBuffer
	s, err := NewStore(client, &Config{Logger: logs.logger()})
	if err != nil {
		t.Fatalf("New with an unreachable server: %v", err)
	}
	if !strings.Contains(logs.String(), "cannot verify") {
		t.Fatalf("New logged %q, want a warning that it could not check the policy", logs.String())
	}
	if _, err := NewStore(client, &Config{RequireNoEviction: true}); err == nil {
		t.Fatal("New with RequireNoEviction and an unreachable server succeeded")
	}

	// Never sent, so the engine schedules no release for it.
	if _, err := s.Claim(ctx, idem.ClaimParams{Tenant: "t", Key: "k", Token: 1, Lease: time.Minute, Retention: time.Hour}); !errors.Is(err, idem.ErrNotApplied) {
		t.Fatalf("Claim on an unreachable server: %v, want an error marked ErrNotApplied", err)
	}
	if _, err := s.Get(ctx, "t", "k"); err == nil || errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("Get on an unreachable server: %v, want a connection error", err)
	}

	e, _ := idem.NewEngine(s, nil)
	_, err = e.Do(ctx, idem.Operation{Tenant: "t", Key: "k"}, func(context.Context) (idem.Result, error) {
		t.Error("handler ran although the store is unreachable")
		return idem.Result{}, nil
	})
	var se *idem.StoreError
	if !errors.As(err, &se) || se.Op != "claim" || !errors.Is(err, idem.ErrStore) {
		t.Fatalf("Do on an unreachable store: %v, want a claim *idem.StoreError", err)
	}
}
