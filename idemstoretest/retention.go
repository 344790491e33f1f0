package idemstoretest

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// retention: past its retention a record counts as absent, decided by
// timestamp, while it stays readable until a purge deletes it.
func (s *suite) retention(t *testing.T) {
	s.parallel(t, "CompleteExpires", func(h *harness) {
		st := h.fx.Store
		start := time.Now()
		p := h.params("order-1", fingerprint("a"))
		p.Lease = shortLease
		p.Retention = shortRetention
		h.mustWin(st, p)
		claimed := time.Now()
		want := idem.Result{Status: 201, Body: []byte("first")}
		h.mustComplete(st, "order-1", p.Token, want)

		res := h.claim(st, h.params("order-1", p.Fingerprint))
		// Only meaningful while the retention surely runs: the store
		// stamped the claim after start, and answered before now.
		if time.Since(start) < shortRetention {
			if res.Won || res.Record == nil || res.Record.State != idem.StateComplete {
				h.t.Fatalf("claim within retention: won=%v record=%s, want lost with the complete record", res.Won, describe(res.Record))
			}
			checkResult(h.t, "replay within retention", res.Record.Result, want)
		} else {
			h.t.Log("the machine is too slow to check the replay within retention")
		}

		sleepPast(h.t, claimed, shortRetention)
		// Nothing purged it: the record is still there to read...
		if rec := h.getExpired(st, "order-1"); rec != nil {
			if rec.State != idem.StateComplete || rec.LeaseToken != p.Token {
				h.t.Errorf("expired record is %s, want complete under token %d", describe(rec), p.Token)
			}
			checkResult(h.t, "expired record", rec.Result, want)
		}
		// ...but counts as absent: a new claim wins, even for another
		// request.
		fresh := h.params("order-1", fingerprint("b"))
		h.mustWin(h.peerOrStore(), fresh)
		rec := h.mustBeInFlight(st, "order-1", fresh.Token)
		if !rec.SameFingerprint(fresh.Fingerprint) {
			h.t.Errorf("fingerprint after the expired record was replaced = %x, want %x", rec.Fingerprint, fresh.Fingerprint)
		}
		if !rec.CompletedAt.IsZero() || rec.Result.Status != 0 || len(rec.Result.Body) != 0 {
			h.t.Errorf("the new in-flight record kept the expired result: %s status=%d body=%q completed_at=%v",
				describe(rec), rec.Result.Status, rec.Result.Body, rec.CompletedAt)
		}
		h.mustComplete(st, "order-1", fresh.Token, idem.Result{Status: 202})
		h.mustBeComplete(st, "order-1", idem.Result{Status: 202})
	})

	s.parallel(t, "AbandonedExpires", func(h *harness) {
		st := h.fx.Store
		// An execution that died: its lease and its retention have both
		// passed. The key is absent even to another request.
		p := h.params("order-1", fingerprint("a"))
		p.Lease = shortLease
		p.Retention = shortLease
		h.mustWin(st, p)
		sleepPast(h.t, time.Now(), shortLease)
		if rec := h.getExpired(st, "order-1"); rec != nil && (rec.State != idem.StateInFlight || rec.LeaseToken != p.Token) {
			h.t.Errorf("abandoned record is %s, want in flight under token %d", describe(rec), p.Token)
		}

		fresh := h.params("order-1", fingerprint("b"))
		h.mustWin(h.peerOrStore(), fresh)
		h.mustBeInFlight(st, "order-1", fresh.Token)
	})
}
