package idemstoretest

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/idem-go/idem"
)

// stepRefused checks, on a store in the single-transaction mode, that
// idem.Step is refused before its function runs, and that the execution
// leaves nothing behind: no step ran, no write committed, the key free.
func (h *harness) stepRefused() {
	h.t.Helper()
	e := h.engines(nil)[0]
	op := idem.Operation{Tenant: h.tenant, Key: "order-1", Fingerprint: fingerprint("POST /payments")}
	var charges atomic.Int32
	write := newName("payment")
	_, err := e.Do(h.ctx, op, func(ctx context.Context) (idem.Result, error) {
		if h.caps.Transactional {
			h.writeFrom(ctx, write)
		}
		_, err := idem.Step(ctx, "charge", func(context.Context) (string, error) {
			charges.Add(1)
			return "ch_1", nil
		})
		return idem.Result{Status: 201}, err
	})
	if !errors.Is(err, idem.ErrStepsUnsupported) || !strings.Contains(err.Error(), "single-transaction mode") {
		h.t.Fatalf("Do with a Step in the single-transaction mode = %v, want idem.ErrStepsUnsupported saying why", err)
	}
	if n := charges.Load(); n != 0 {
		h.t.Errorf("the refused step's function ran %d times, want 0", n)
	}
	if h.caps.Transactional {
		h.mustCount(write, 0, "the execution whose step was refused leaves no business write")
	}
	h.mustBeAbsent(h.fx.Store, "order-1")
}
