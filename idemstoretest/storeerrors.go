package idemstoretest

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
)

// storeErrors: a store that cannot do what it was asked says so. A claim
// that fails must never look won, or the engine would run the handler
// without protection.
func (s *suite) storeErrors(t *testing.T) {
	s.parallel(t, "CancelledClaimFails", func(h *harness) {
		st := h.fx.Store
		ctx, cancel := context.WithCancel(h.ctx)
		cancel()
		res, err := st.Claim(ctx, h.params("order-1", fingerprint("a")))
		if err == nil {
			h.t.Fatalf("Claim with a cancelled context = %+v, nil; want an error", res)
		}
		if res.Won {
			h.t.Errorf("Claim with a cancelled context returned an error and Won")
		}
		h.mustBeAbsent(st, "order-1")
	})

	s.parallel(t, "CancelledCompleteTellsTruth", func(h *harness) {
		st := h.fx.Store
		p := h.params("order-1", fingerprint("a"))
		h.mustWin(st, p)
		tx := h.begin(st)
		defer tx.Rollback(h.ctx) //nolint:errcheck // harmless after Complete
		ctx, cancel := context.WithCancel(h.ctx)
		cancel()
		want := idem.Result{Status: 201}
		err := tx.Complete(ctx, idem.CompleteParams{Tenant: h.tenant, Key: "order-1", Token: p.Token, Result: want})
		// Whatever the store does with a dead context, its answer must
		// match what it stored: nil means complete, an error means not.
		rec := h.get(st, "order-1")
		switch {
		case err == nil && rec.State != idem.StateComplete:
			h.t.Errorf("Complete with a cancelled context returned nil but the record is %s", describe(rec))
		case err != nil && rec.State != idem.StateInFlight:
			h.t.Errorf("Complete with a cancelled context returned %v but the record is %s", err, describe(rec))
		case errors.Is(err, idem.ErrLeaseLost):
			h.t.Errorf("Complete with a cancelled context = %v; the lease was not lost", err)
		}
	})

	s.parallel(t, "EngineFailsClosed", func(h *harness) {
		e := h.engines(nil)[0]
		ctx, cancel := context.WithCancel(h.ctx)
		cancel()
		_, err := e.Do(ctx, idem.Operation{Tenant: h.tenant, Key: "order-1"}, func(context.Context) (idem.Result, error) {
			h.t.Error("fn ran although the claim failed")
			return idem.Result{}, nil
		})
		if !errors.Is(err, idem.ErrStore) {
			h.t.Errorf("Do with a store that fails = %v, want an error wrapping idem.ErrStore", err)
		}
		h.mustBeAbsent(h.fx.Store, "order-1")
	})
}
