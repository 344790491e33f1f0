package idemstoretest

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// claimRaceGoroutines is how many executions claim one key at once.
const claimRaceGoroutines = 50

// claim: the atomic claim and what a lost claim returns.
func (s *suite) claim(t *testing.T) {
	s.parallel(t, "AbsentWins", func(h *harness) {
		st := h.fx.Store
		h.mustBeAbsent(st, "order-1")
		p := h.params("order-1", fingerprint("POST /orders {1}"))
		h.mustWin(st, p)

		rec := h.mustBeInFlight(st, "order-1", p.Token)
		if !rec.SameFingerprint(p.Fingerprint) {
			h.t.Errorf("stored fingerprint %x, want %x", rec.Fingerprint, p.Fingerprint)
		}
		if !rec.CompletedAt.IsZero() {
			h.t.Errorf("CompletedAt = %v on an in-flight record, want zero", rec.CompletedAt)
		}
		// The lease and the retention are counted from the claim on the
		// store's clock; a second of slack covers stores that stamp
		// created_at and the lease in separate operations.
		checkSpan(h.t, "LockedUntil-CreatedAt", rec.LockedUntil.Sub(rec.CreatedAt), p.Lease)
		checkSpan(h.t, "ExpiresAt-CreatedAt", rec.ExpiresAt.Sub(rec.CreatedAt), p.Retention)
	})

	s.parallel(t, "GetAbsent", func(h *harness) {
		rec, err := h.fx.Store.Get(h.ctx, h.tenant, "never-claimed")
		if !errors.Is(err, idem.ErrNotFound) || rec != nil {
			h.t.Fatalf("Get of a key never claimed = %s, %v; want nil, idem.ErrNotFound", describe(rec), err)
		}
	})

	s.parallel(t, "SecondClaimLoses", func(h *harness) {
		st := h.fx.Store
		first := h.params("order-1", fingerprint("POST /orders {1}"))
		h.mustWin(st, first)

		for _, other := range h.stores() {
			second := h.params("order-1", first.Fingerprint)
			rec := h.mustLose(other, second)
			if rec.State != idem.StateInFlight || rec.LeaseToken != first.Token || !rec.SameFingerprint(first.Fingerprint) {
				h.t.Errorf("lost claim returned %s, want in flight under token %d with fingerprint %x", describe(rec), first.Token, first.Fingerprint)
			}
		}
		h.mustBeInFlight(st, "order-1", first.Token)
	})

	s.parallel(t, "CompleteThenClaimReplays", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("POST /orders {1}"))
		h.mustWin(st, p)
		want := idem.Result{
			Mode:   idem.ModeResponse,
			Status: 201,
			Header: map[string][]string{
				"Content-Type": {"application/json"},
				"Location":     {"/orders/1"},
				"Link":         {"</a>; rel=a", "</b>; rel=b"},
			},
			Body: []byte(`{"id":1}`),
		}
		h.mustComplete(st, "order-1", p.Token, want)

		for _, other := range h.stores() {
			rec := h.mustLose(other, h.params("order-1", p.Fingerprint))
			if rec.State != idem.StateComplete {
				h.t.Fatalf("claim after completion returned %s, want complete", describe(rec))
			}
			checkResult(h.t, "replayed result", rec.Result, want)
			if rec.LeaseToken != p.Token {
				h.t.Errorf("complete record holds token %d, want the completer's %d", rec.LeaseToken, p.Token)
			}
			if rec.CompletedAt.IsZero() || rec.CompletedAt.Before(rec.CreatedAt) {
				h.t.Errorf("CompletedAt = %v, want a time not before CreatedAt %v", rec.CompletedAt, rec.CreatedAt)
			}
			// Another fingerprint loses too, and sees the original
			// fingerprint: the caller answers 422 from it.
			rec = h.mustLose(other, h.params("order-1", fingerprint("POST /orders {2}")))
			if rec.State != idem.StateComplete || !rec.SameFingerprint(p.Fingerprint) {
				h.t.Errorf("claim with another fingerprint returned %s, want the complete record with fingerprint %x", describe(rec), p.Fingerprint)
			}
		}
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "StorageModes", func(h *harness) {
		st := h.fx.Store
		for key, want := range map[string]idem.Result{
			"reference": {Mode: idem.ModeReference, Status: 201, Reference: "ord_42"},
			"marker":    {Mode: idem.ModeMarker, Status: 204},
			"no-status": {Mode: idem.ModeResponse},
		} {
			p := h.params(key, fingerprint(key))
			h.mustWin(st, p)
			h.mustComplete(st, key, p.Token, want)
			rec := h.mustLose(st, h.params(key, p.Fingerprint))
			checkResult(h.t, "replayed "+key, rec.Result, want)
			h.mustBeComplete(st, key, want)
		}
	})

	s.parallel(t, "NoFingerprint", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", nil)
		h.mustWin(st, p)
		rec := h.mustLose(st, h.params("order-1", nil))
		if !rec.SameFingerprint(nil) {
			h.t.Errorf("a claim without fingerprint stored %x, want none", rec.Fingerprint)
		}
		if rec.SameFingerprint(fingerprint("x")) {
			h.t.Error("a record without fingerprint matches a fingerprinted retry")
		}
	})

	s.parallel(t, "AwkwardKeys", func(h *harness) {
		st := h.fx.Store
		// Every visible ASCII character is a valid key character: quotes,
		// LIKE wildcards, Redis separators and hash tags included. Keys
		// differing only in case are different keys.
		var all strings.Builder
		for c := byte(0x21); c <= 0x7e; c++ {
			all.WriteByte(c)
		}
		keys := []string{
			all.String(),
			strings.Repeat("k", idem.MaxKeyLength),
			"abc", "ABC",
			`%`, `_`, `'`, `\`, `*`, `{x}`, `a:b`,
		}
		tokens := make(map[string]int64)
		for _, key := range keys {
			p := h.params(key, fingerprint(key))
			h.mustWin(st, p)
			tokens[key] = p.Token
		}
		for _, key := range keys {
			rec := h.mustLose(st, h.params(key, fingerprint(key)))
			if rec.LeaseToken != tokens[key] {
				h.t.Errorf("key %q returned the record of token %d, want %d", key, rec.LeaseToken, tokens[key])
			}
			h.mustBeInFlight(st, key, tokens[key])
		}
	})

	s.parallel(t, "Race", func(h *harness) {
		if h.fx.Peer == nil {
			h.t.Log("no Peer: every claim goes through Store")
		}
		for round := range 5 {
			h.claimRace("race-" + strconv.Itoa(round))
		}
	})

	// The claims that replace a record (a takeover, or a record past
	// retention) go through another statement than the first insert, and
	// must be just as exclusive.
	s.parallel(t, "RaceOverExpired", func(h *harness) {
		st := h.fx.Store
		var keys []string
		for round := range 3 {
			abandoned := "abandoned-" + strconv.Itoa(round)
			p := h.params(abandoned, fingerprint("same request"))
			p.Lease = shortLease
			h.mustWin(st, p)

			expired := "expired-" + strconv.Itoa(round)
			p = h.params(expired, fingerprint("old request"))
			p.Lease, p.Retention = shortLease, shortLease
			h.mustWin(st, p)
			h.mustComplete(st, expired, p.Token, idem.Result{Status: 201})
			keys = append(keys, abandoned, expired)
		}
		sleepPast(h.t, time.Now(), shortLease)
		for _, key := range keys {
			h.claimRace(key)
		}
	})
}

// claimRace has claimRaceGoroutines executions, spread over Store and
// Peer, claim key at the same instant with one fingerprint, and checks
// that exactly one wins and every other one sees the winner's record.
func (h *harness) claimRace(key string) {
	h.t.Helper()
	stores := h.stores()
	params := make([]idem.ClaimParams, claimRaceGoroutines)
	results := make([]idem.ClaimResult, claimRaceGoroutines)
	errs := make([]error, claimRaceGoroutines)
	for i := range params {
		params[i] = h.params(key, fingerprint("same request"))
	}
	atOnce(claimRaceGoroutines, func(i int) {
		results[i], errs[i] = stores[i%len(stores)].Claim(h.ctx, params[i])
	})

	winner := -1
	for i, res := range results {
		if errs[i] != nil {
			h.t.Fatalf("%s: claim %d: %v", key, i, errs[i])
		}
		if res.Won {
			if winner >= 0 {
				h.t.Fatalf("%s: claims %d and %d both won", key, winner, i)
			}
			winner = i
		}
	}
	if winner < 0 {
		h.t.Fatalf("%s: none of %d concurrent claims won", key, claimRaceGoroutines)
	}
	token := params[winner].Token
	for i, res := range results {
		if i == winner {
			continue
		}
		if res.Record == nil || res.Record.State != idem.StateInFlight || res.Record.LeaseToken != token {
			h.t.Errorf("%s: losing claim %d returned %s, want in flight under the winner's token %d", key, i, describe(res.Record), token)
		}
	}
	for _, st := range stores {
		h.mustBeInFlight(st, key, token)
	}
}
