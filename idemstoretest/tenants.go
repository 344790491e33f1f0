package idemstoretest

import (
	"errors"
	"testing"

	"github.com/idem-go/idem"
)

// tenants: one key under two tenants names two unrelated operations.
func (s *suite) tenants(t *testing.T) {
	s.parallel(t, "SameKeyTwoTenants", func(h *harness) {
		a, b := h, h.withTenant(newName("tenant"))
		pa, pb := a.params("order-1", fingerprint("a")), b.params("order-1", fingerprint("b"))
		stores := h.stores()

		var res [2]idem.ClaimResult
		var errs [2]error
		atOnce(2, func(i int) {
			p := []idem.ClaimParams{pa, pb}[i]
			res[i], errs[i] = stores[i%len(stores)].Claim(h.ctx, p)
		})
		for i := range res {
			if errs[i] != nil {
				h.t.Fatalf("claim %d: %v", i, errs[i])
			}
			if !res[i].Won {
				h.t.Fatalf("tenant %d lost the claim of its own key to %s", i, describe(res[i].Record))
			}
		}

		wantA := idem.Result{Status: 201, Body: []byte("tenant a")}
		a.mustComplete(h.fx.Store, "order-1", pa.Token, wantA)
		// B is still in flight under its own token, not complete with A's
		// result.
		rec := b.mustLose(h.fx.Store, b.params("order-1", pb.Fingerprint))
		if rec.State != idem.StateInFlight || rec.LeaseToken != pb.Token {
			h.t.Fatalf("tenant B sees %s, want its own in-flight record of token %d", describe(rec), pb.Token)
		}
		wantB := idem.Result{Status: 202, Body: []byte("tenant b")}
		b.mustComplete(h.peerOrStore(), "order-1", pb.Token, wantB)

		a.mustBeComplete(h.fx.Store, "order-1", wantA)
		b.mustBeComplete(h.fx.Store, "order-1", wantB)
	})

	s.parallel(t, "OtherTenantNeverSees", func(h *harness) {
		st := h.fx.Store
		a, b := h, h.withTenant(newName("tenant"))
		p := a.params("order-1", fingerprint("a"))
		a.mustWin(st, p)
		b.mustBeAbsent(st, "order-1")
		a.mustComplete(st, "order-1", p.Token, idem.Result{Status: 201, Body: []byte("secret of a")})
		b.mustBeAbsent(st, "order-1")
		// With A's fingerprint, B still runs its own operation: nothing
		// of A's result can leak through a replay.
		b.mustWin(st, b.params("order-1", p.Fingerprint))
	})

	s.parallel(t, "TokensDoNotCross", func(h *harness) {
		st := h.fx.Store
		a, b := h, h.withTenant(newName("tenant"))
		pa, pb := a.params("order-1", nil), b.params("order-1", nil)
		a.mustWin(st, pa)
		b.mustWin(st, pb)

		// A's token means nothing under B's tenant.
		err := b.complete(st, "order-1", pa.Token, idem.Result{Status: 201})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Complete under tenant B with A's token = %v, want idem.ErrLeaseLost", err)
		}
		err = st.Extend(h.ctx, idem.ExtendParams{Tenant: b.tenant, Key: "order-1", Token: pa.Token, Lease: longLease})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Extend under tenant B with A's token = %v, want idem.ErrLeaseLost", err)
		}
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: b.tenant, Key: "order-1", Token: pa.Token}); err != nil {
			h.t.Errorf("Release under tenant B with A's token: %v", err)
		}
		b.mustBeInFlight(st, "order-1", pb.Token)
		a.mustBeInFlight(st, "order-1", pa.Token)

		// Releasing B leaves A alone.
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: b.tenant, Key: "order-1", Token: pb.Token}); err != nil {
			h.t.Fatalf("Release of B: %v", err)
		}
		b.mustBeAbsent(st, "order-1")
		a.mustBeInFlight(st, "order-1", pa.Token)
	})

	s.parallel(t, "NoCollisions", func(h *harness) {
		st := h.fx.Store
		// Pairs that a careless encoding of (tenant, key) into one string,
		// a case-insensitive collation or a PAD SPACE one would merge.
		base := h.tenant
		cases := []struct{ tenant, key string }{
			{base + ":a", "b:c"},
			{base + ":a:b", "c"},
			{base + "/a", "b/c"},
			{base + "/a/b", "c"},
			{base + "-x", "k"},
			{base + "-X", "k"},
			{base + "-x", "K"},
			{base + "-p", "k"},
			{base + "-p ", "k"},
		}
		tokens := make([]int64, len(cases))
		for i, c := range cases {
			p := h.withTenant(c.tenant).params(c.key, nil)
			h.withTenant(c.tenant).mustWin(st, p)
			tokens[i] = p.Token
		}
		for i, c := range cases {
			h.withTenant(c.tenant).mustBeInFlight(st, c.key, tokens[i])
		}
	})

	s.parallel(t, "EmptyTenant", func(h *harness) {
		st := h.fx.Store
		// The empty tenant is valid (a single-tenant service). It is
		// shared by every run, so the key is fresh instead.
		empty := h.withTenant("")
		key := newName("order")
		p := empty.params(key, fingerprint("a"))
		empty.mustWin(st, p)
		h.mustBeAbsent(st, key)
		want := idem.Result{Status: 201}
		empty.mustComplete(st, key, p.Token, want)
		empty.mustBeComplete(st, key, want)
		h.mustWin(st, h.params(key, p.Fingerprint))
	})
}
