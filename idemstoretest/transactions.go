package idemstoretest

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// transactions: the business write and the stored result commit together
// or not at all.
func (s *suite) transactions(t *testing.T) {
	s.parallel(t, "RollbackKeepsNothing", func(h *harness) {
		h.requireTransactional()
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		business := newName("order")
		tx := h.begin(st)
		h.businessWrite(tx, business)
		if err := tx.Rollback(h.ctx); err != nil {
			h.t.Fatalf("Rollback: %v", err)
		}
		h.mustCount(business, 0, "a rolled back business write must not commit")
		h.mustBeInFlight(st, "order-1", p.Token)

		// The key is still ours: a new unit of work completes it.
		again := newName("order")
		tx = h.begin(st)
		h.businessWrite(tx, again)
		want := idem.Result{Status: 201}
		if err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Result: want}); err != nil {
			h.t.Fatalf("Complete after a rolled back unit of work: %v", err)
		}
		h.mustCount(again, 1, "Complete commits the business write")
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "CompleteCommitsBoth", func(h *harness) {
		h.requireTransactional()
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		business := newName("order")
		tx := h.begin(st)
		h.businessWrite(tx, business)
		want := idem.Result{Status: 201, Body: []byte(business)}
		if err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Result: want}); err != nil {
			h.t.Fatalf("Complete: %v", err)
		}
		h.mustCount(business, 1, "Complete commits the business write")
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "RollbackAfterComplete", func(h *harness) {
		h.requireTransactional()
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		business := newName("order")
		tx := h.begin(st)
		h.businessWrite(tx, business)
		want := idem.Result{Status: 201}
		if err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Result: want}); err != nil {
			h.t.Fatalf("Complete: %v", err)
		}
		// The deferred Rollback of every handler: it may say the unit of
		// work is closed, but must undo nothing.
		if err := tx.Rollback(h.ctx); err != nil {
			h.t.Logf("Rollback after Complete returned %v (allowed; it must only be harmless)", err)
		}
		h.mustCount(business, 1, "Rollback after Complete must not undo the commit")
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "RefusedCompleteRollsBack", func(h *harness) {
		h.requireTransactional()
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "order-1", Token: p.Token}); err != nil {
			h.t.Fatalf("Release: %v", err)
		}
		business := newName("order")
		tx := h.begin(st)
		h.businessWrite(tx, business)
		err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Result: idem.Result{Status: 201}})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Complete of a released key = %v, want idem.ErrLeaseLost", err)
		}
		_ = tx.Rollback(h.ctx)
		h.mustCount(business, 0, "a refused completion rolls its business write back")
		h.mustBeAbsent(st, "order-1")
	})

	s.parallel(t, "TakeoverByPeerRollsBack", func(h *harness) {
		h.requireConcurrentWriters()
		h.requireTransactional()
		st, peer := h.fx.Store, h.requirePeer()
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		claimed := time.Now()

		// The slow execution writes, then stalls past its lease...
		oldWrite := newName("order")
		tx := h.begin(st)
		defer tx.Rollback(h.ctx) //nolint:errcheck // harmless after Complete
		h.businessWrite(tx, oldWrite)
		sleepPast(h.t, claimed, shortLease)

		// ...another process takes the key over and completes...
		takeover := h.params("order-1", old.Fingerprint)
		h.mustWin(peer, takeover)
		newWrite := newName("order")
		peerTx := h.begin(peer)
		h.businessWrite(peerTx, newWrite)
		want := idem.Result{Status: 201, Body: []byte("taker")}
		if err := peerTx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: takeover.Token, Result: want}); err != nil {
			h.t.Fatalf("Complete by the taker: %v", err)
		}

		// ...and the slow one's completion is refused, its write undone.
		err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: old.Token, Result: idem.Result{Status: 201, Body: []byte("old")}})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Complete by the execution taken over = %v, want idem.ErrLeaseLost", err)
		}
		h.mustCount(oldWrite, 0, "the business write of an execution taken over must roll back")
		h.mustCount(newWrite, 1, "the taker's business write commits")
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "TakeoverBeforeCompleteRollsBack", func(h *harness) {
		h.requireConcurrentWriters()
		h.requireTransactional()
		st, peer := h.fx.Store, h.requirePeer()
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		claimed := time.Now()
		oldWrite := newName("order")
		tx := h.begin(st)
		defer tx.Rollback(h.ctx) //nolint:errcheck // harmless after Complete
		h.businessWrite(tx, oldWrite)
		sleepPast(h.t, claimed, shortLease)

		// The taker is still running when the slow one tries to complete.
		takeover := h.params("order-1", old.Fingerprint)
		h.mustWin(peer, takeover)
		err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: old.Token, Result: idem.Result{Status: 201}})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Complete by the execution taken over = %v, want idem.ErrLeaseLost", err)
		}
		h.mustCount(oldWrite, 0, "the business write of an execution taken over must roll back")
		h.mustBeInFlight(st, "order-1", takeover.Token)
	})
}
