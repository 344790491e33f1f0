package idemstoretest

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// fencing: only the holder of the lease token completes or releases.
func (s *suite) fencing(t *testing.T) {
	s.parallel(t, "CompleteWrongToken", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)

		business := newName("order")
		tx := h.begin(st)
		if h.caps.Transactional {
			h.businessWrite(tx, business)
		}
		err := tx.Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: newToken(), Result: idem.Result{Status: 201}})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Complete with a wrong token = %v, want idem.ErrLeaseLost", err)
		}
		_ = tx.Rollback(h.ctx)
		if h.caps.Transactional {
			h.mustCount(business, 0, "the business write of a refused completion must roll back")
		}
		h.mustBeInFlight(st, "order-1", p.Token)

		// The holder still completes.
		want := idem.Result{Status: 201, Body: []byte("ok")}
		h.mustComplete(st, "order-1", p.Token, want)
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "CompleteAfterTakeover", func(h *harness) {
		st, taker := h.fx.Store, h.peerOrStore()
		old := h.params("order-1", fingerprint("a"))
		old.Lease = shortLease
		h.mustWin(st, old)
		sleepPast(h.t, time.Now(), shortLease)

		takeover := h.params("order-1", old.Fingerprint)
		h.mustWin(taker, takeover)

		err := h.complete(st, "order-1", old.Token, idem.Result{Status: 201, Body: []byte("old")})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Fatalf("Complete by the execution that was taken over = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeInFlight(st, "order-1", takeover.Token)

		want := idem.Result{Status: 201, Body: []byte("new")}
		h.mustComplete(taker, "order-1", takeover.Token, want)
		rec := h.mustBeComplete(st, "order-1", want)
		if rec.LeaseToken != takeover.Token {
			h.t.Errorf("complete record holds token %d, want the taker's %d", rec.LeaseToken, takeover.Token)
		}
	})

	s.parallel(t, "CompleteTwice", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		want := idem.Result{Status: 201, Body: []byte("first")}
		h.mustComplete(st, "order-1", p.Token, want)

		err := h.complete(st, "order-1", p.Token, idem.Result{Status: 500, Body: []byte("second")})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("second Complete = %v, want idem.ErrLeaseLost (the record is no longer in flight)", err)
		}
		h.mustBeComplete(st, "order-1", want)
	})

	// Two completions under one token at the same instant (an engine
	// that completes twice, a retried commit): one wins, and with it only
	// one business write.
	s.parallel(t, "CompleteRace", func(h *harness) {
		h.requireConcurrentWriters()
		stores := h.stores()
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(h.fx.Store, p)
		txs := make([]idem.UnitOfWork, 2)
		writes := make([]string, 2)
		for i := range txs {
			txs[i] = h.begin(stores[i%len(stores)])
			defer txs[i].Rollback(h.ctx) //nolint:errcheck // harmless after Complete
			if h.caps.Transactional {
				writes[i] = newName("order")
				h.businessWrite(txs[i], writes[i])
			}
		}
		results := []idem.Result{{Status: 201, Body: []byte("0")}, {Status: 201, Body: []byte("1")}}
		errs := make([]error, 2)
		atOnce(2, func(i int) {
			errs[i] = txs[i].Complete(h.ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Result: results[i]})
		})
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				h.t.Fatalf("both completions under one token succeeded")
			case err == nil:
				winner = i
			case !errors.Is(err, idem.ErrLeaseLost):
				h.t.Fatalf("completion %d: %v, want nil or idem.ErrLeaseLost", i, err)
			}
		}
		if winner < 0 {
			h.t.Fatal("neither completion succeeded")
		}
		h.mustBeComplete(h.fx.Store, "order-1", results[winner])
		if h.caps.Transactional {
			h.mustCount(writes[winner], 1, "the winning completion commits its write")
			h.mustCount(writes[1-winner], 0, "the refused completion rolls its write back")
		}
	})

	s.parallel(t, "CompleteAbsent", func(h *harness) {
		st := h.fx.Store
		err := h.complete(st, "never-claimed", newToken(), idem.Result{Status: 201})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Complete of a key never claimed = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeAbsent(st, "never-claimed")
	})

	s.parallel(t, "ReleaseWrongToken", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "order-1", Token: newToken()}); err != nil {
			h.t.Fatalf("Release with a wrong token: %v, want nil", err)
		}
		h.mustBeInFlight(st, "order-1", p.Token)

		// The holder's release deletes it, and the key is free again.
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "order-1", Token: p.Token}); err != nil {
			h.t.Fatalf("Release by the holder: %v", err)
		}
		h.mustBeAbsent(st, "order-1")
		h.mustWin(h.peerOrStore(), h.params("order-1", fingerprint("b")))
	})

	s.parallel(t, "ReleaseComplete", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		want := idem.Result{Status: 201, Body: []byte("kept")}
		h.mustComplete(st, "order-1", p.Token, want)
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "order-1", Token: p.Token}); err != nil {
			h.t.Fatalf("Release of a complete record: %v, want nil", err)
		}
		h.mustBeComplete(st, "order-1", want)
	})

	s.parallel(t, "ReleaseAbsent", func(h *harness) {
		st := h.fx.Store
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "never-claimed", Token: newToken()}); err != nil {
			h.t.Errorf("Release of a key never claimed: %v, want nil", err)
		}
		h.mustBeAbsent(st, "never-claimed")
	})

	s.parallel(t, "CompleteAfterRelease", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "order-1", Token: p.Token}); err != nil {
			h.t.Fatalf("Release: %v", err)
		}
		err := h.complete(st, "order-1", p.Token, idem.Result{Status: 201})
		if !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("Complete after Release = %v, want idem.ErrLeaseLost", err)
		}
		h.mustBeAbsent(st, "order-1")
	})
}
