package idemstoretest

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// lease: an expired lease may be taken over by the same request only, a
// valid one never, and Extend keeps it for its holder alone.
func (s *suite) lease(t *testing.T) {
	s.parallel(t, "TakeoverAfterExpiry", func(h *harness) {
		st, taker := h.fx.Store, h.peerOrStore()
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		claimed := time.Now()
		before := h.mustBeInFlight(st, "order-1", old.Token)
		sleepPast(h.t, claimed, shortLease)

		takeover := h.params("order-1", old.Fingerprint)
		h.mustWin(taker, takeover)
		rec := h.mustBeInFlight(st, "order-1", takeover.Token)
		if !rec.LockedUntil.After(before.LockedUntil) {
			h.t.Errorf("after the takeover the lease ends at %v, want after the expired one (%v)", rec.LockedUntil, before.LockedUntil)
		}
		if !rec.SameFingerprint(old.Fingerprint) {
			h.t.Errorf("fingerprint after takeover = %x, want %x", rec.Fingerprint, old.Fingerprint)
		}
	})

	s.parallel(t, "NoTakeoverWithOtherFingerprint", func(h *harness) {
		st := h.fx.Store
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		sleepPast(h.t, time.Now(), shortLease)

		// An expired lease is no licence to run another request under the
		// key: the caller answers 422 from the returned record.
		rec := h.mustLose(h.peerOrStore(), h.params("order-1", fingerprint("b")))
		if rec.State != idem.StateInFlight || rec.LeaseToken != old.Token || !rec.SameFingerprint(old.Fingerprint) {
			h.t.Errorf("claim with another fingerprint returned %s, want the expired record of token %d", describe(rec), old.Token)
		}
		h.mustBeInFlight(st, "order-1", old.Token)
	})

	s.parallel(t, "NoTakeoverWhileValid", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		for _, other := range h.stores() {
			rec := h.mustLose(other, h.params("order-1", p.Fingerprint))
			if rec.LeaseToken != p.Token {
				h.t.Errorf("claim under a valid lease returned token %d, want the holder's %d", rec.LeaseToken, p.Token)
			}
		}
		h.mustBeInFlight(st, "order-1", p.Token)
	})

	s.parallel(t, "ExtendKeepsKey", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		p.Lease = shortLease
		// A retention no longer than the lease: Extend must carry it
		// past the new end of the lease, or the key would count as absent
		// under a live handler.
		p.Retention = shortLease
		h.mustWin(st, p)
		claimed := time.Now()
		before := h.mustBeInFlight(st, "order-1", p.Token)

		if err := st.Extend(h.ctx, idem.ExtendParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Lease: longLease}); err != nil {
			h.t.Fatalf("Extend by the holder: %v", err)
		}
		rec := h.mustBeInFlight(st, "order-1", p.Token)
		if !rec.LockedUntil.After(before.LockedUntil) {
			h.t.Errorf("Extend left the lease ending at %v, want after %v", rec.LockedUntil, before.LockedUntil)
		}
		if rec.ExpiresAt.Before(rec.LockedUntil) {
			h.t.Errorf("after Extend the retention ends at %v, before the lease (%v)", rec.ExpiresAt, rec.LockedUntil)
		}

		sleepPast(h.t, claimed, shortLease)
		for _, other := range h.stores() {
			lost := h.mustLose(other, h.params("order-1", p.Fingerprint))
			if lost.LeaseToken != p.Token {
				h.t.Errorf("claim past the original lease returned token %d, want the extended holder's %d", lost.LeaseToken, p.Token)
			}
		}
		h.mustBeInFlight(st, "order-1", p.Token)
	})

	s.parallel(t, "ExtendWrongToken", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		before := h.mustBeInFlight(st, "order-1", p.Token)
		err := st.Extend(h.ctx, idem.ExtendParams{Tenant: h.tenant, Key: "order-1", Token: newToken(), Lease: 2 * longLease})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Extend with a wrong token = %v, want idem.ErrLeaseLost", err)
		}
		rec := h.mustBeInFlight(st, "order-1", p.Token)
		if !rec.LockedUntil.Equal(before.LockedUntil) {
			h.t.Errorf("Extend with a wrong token moved the lease from %v to %v", before.LockedUntil, rec.LockedUntil)
		}
	})

	s.parallel(t, "ExtendComplete", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		want := idem.Result{Status: 201}
		h.mustComplete(st, "order-1", p.Token, want)
		err := st.Extend(h.ctx, idem.ExtendParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Lease: longLease})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Extend of a complete record = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "ExtendAbsent", func(h *harness) {
		st := h.fx.Store
		err := st.Extend(h.ctx, idem.ExtendParams{Tenant: h.tenant, Key: "never-claimed", Token: newToken(), Lease: longLease})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Extend of a key never claimed = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeAbsent(st, "never-claimed")
	})

	s.parallel(t, "ExtendAfterTakeover", func(h *harness) {
		st := h.fx.Store
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		sleepPast(h.t, time.Now(), shortLease)
		takeover := h.params("order-1", old.Fingerprint)
		h.mustWin(h.peerOrStore(), takeover)

		// The heartbeat of the execution taken over learns it here, and
		// stops its handler.
		err := st.Extend(h.ctx, idem.ExtendParams{Tenant: h.tenant, Key: "order-1", Token: old.Token, Lease: longLease})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Extend after a takeover = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeInFlight(st, "order-1", takeover.Token)
	})
}
