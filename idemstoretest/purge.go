package idemstoretest

import (
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// purge: expired records go in bounded batches, live ones never.
func (s *suite) purge(t *testing.T) {
	// Serial: a purge deletes the expired records of every tenant, so two
	// purging cases side by side would count each other's deletions.
	s.serial(t, "BoundedBatches", func(h *harness) {
		st := h.fx.Store
		const limit = 3
		var expired, live []string
		liveResults := make(map[string]idem.Result)

		// Expired: complete past retention, and abandoned in flight past
		// both lease and retention.
		for i := range 5 {
			key := "expired-complete-" + strconv.Itoa(i)
			p := h.params(key, fingerprint(key))
			p.Lease, p.Retention = shortLease, shortLease
			h.mustWin(st, p)
			h.mustComplete(st, key, p.Token, idem.Result{Status: 201})
			expired = append(expired, key)
		}
		for i := range 2 {
			key := "expired-abandoned-" + strconv.Itoa(i)
			p := h.params(key, fingerprint(key))
			p.Lease, p.Retention = shortLease, shortLease
			h.mustWin(st, p)
			expired = append(expired, key)
		}
		// Live: complete within retention, in flight under a live lease,
		// and in flight under a live lease whose claim gave a shorter
		// retention (a store must not delete a record a handler still
		// holds, whatever its retention).
		for i := range 2 {
			key := "live-complete-" + strconv.Itoa(i)
			p := h.params(key, fingerprint(key))
			h.mustWin(st, p)
			res := idem.Result{Status: 201, Body: []byte(key)}
			h.mustComplete(st, key, p.Token, res)
			live = append(live, key)
			liveResults[key] = res
		}
		p := h.params("live-in-flight", nil)
		h.mustWin(st, p)
		live = append(live, p.Key)
		p = h.params("live-lease-short-retention", nil)
		p.Retention = shortLease
		h.mustWin(st, p)
		live = append(live, p.Key)

		sleepPast(h.t, time.Now(), shortLease)

		// Other cases sharing the database may have left expired records
		// too: the first batch is full either way (unless the database
		// deleted them all by itself), and the loop ends when a batch
		// comes back short.
		for call := 0; ; call++ {
			n, err := st.Purge(h.ctx, idem.PurgeParams{Limit: limit})
			if err != nil {
				h.t.Fatalf("Purge: %v", err)
			}
			if n > limit {
				h.t.Fatalf("Purge(Limit: %d) deleted %d records", limit, n)
			}
			if call == 0 && n != limit && !h.caps.SelfExpiring {
				h.t.Errorf("first Purge(Limit: %d) deleted %d records, want %d (at least %d have expired)", limit, n, limit, len(expired))
			}
			if n < limit {
				break
			}
			if call > 10000 {
				h.t.Fatal("Purge keeps returning full batches")
			}
		}

		for _, key := range expired {
			h.mustBeAbsent(st, key)
		}
		for _, key := range live {
			rec := h.get(st, key)
			if res, ok := liveResults[key]; ok {
				if rec.State != idem.StateComplete {
					h.t.Errorf("live record %s, want complete", describe(rec))
				}
				checkResult(h.t, "live record "+key, rec.Result, res)
			} else if rec.State != idem.StateInFlight {
				h.t.Errorf("live record %s, want in flight", describe(rec))
			}
		}
	})

	// A purge that picks expired records, then deletes them by key
	// without checking again, deletes the record a claim has just put in
	// their place: the new execution then runs unprotected.
	s.serial(t, "RacesClaims", func(h *harness) {
		st := h.fx.Store
		const keys, purgers = 20, 2
		for i := range keys {
			key := "k-" + strconv.Itoa(i)
			p := h.params(key, fingerprint(key))
			p.Lease, p.Retention = shortLease, shortLease
			h.mustWin(st, p)
			h.mustComplete(st, key, p.Token, idem.Result{Status: 201})
		}
		sleepPast(h.t, time.Now(), shortLease)

		params := make([]idem.ClaimParams, keys)
		for i := range params {
			params[i] = h.params("k-"+strconv.Itoa(i), fingerprint("another request"))
		}
		results := make([]idem.ClaimResult, keys)
		errs := make([]error, keys+purgers)
		stores := h.stores()
		atOnce(keys+purgers, func(i int) {
			if i >= keys {
				// Small batches, repeated, to be deleting while the claims
				// replace.
				for range keys {
					if _, errs[i] = stores[i%len(stores)].Purge(h.ctx, idem.PurgeParams{Limit: 2}); errs[i] != nil {
						return
					}
				}
				return
			}
			results[i], errs[i] = stores[i%len(stores)].Claim(h.ctx, params[i])
		})
		for i, err := range errs {
			if err != nil {
				h.t.Fatalf("goroutine %d: %v", i, err)
			}
		}
		for i, p := range params {
			if !results[i].Won {
				h.t.Errorf("claim of the expired %s lost to %s", p.Key, describe(results[i].Record))
				continue
			}
			rec, err := st.Get(h.ctx, h.tenant, p.Key)
			if err != nil || rec.State != idem.StateInFlight || rec.LeaseToken != p.Token {
				h.t.Errorf("after a claim raced a purge, %s is %s, %v; want in flight under the claim's token %d", p.Key, describe(rec), err, p.Token)
			}
		}
	})

	s.serial(t, "KeepsLiveRecords", func(h *harness) {
		st := h.fx.Store
		p := h.params("live", fingerprint("a"))
		h.mustWin(st, p)
		want := idem.Result{Status: 201, Body: []byte("kept")}
		h.mustComplete(st, "live", p.Token, want)
		for range 3 {
			if _, err := st.Purge(h.ctx, idem.PurgeParams{}); err != nil {
				h.t.Fatalf("Purge: %v", err)
			}
		}
		h.mustBeComplete(st, "live", want)
		h.mustLose(st, h.params("live", p.Fingerprint))
	})
}
