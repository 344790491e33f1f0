package idemstoretest

import (
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkeys"
)

// listing: operators list, count, release and forget records
// (idemkeys.Lister), each status judged by the store's clock, a page
// after another without a record lost or repeated.
func (s *suite) listing(t *testing.T) {
	if _, ok := s.newFixture(t).Store.(idemkeys.Lister); !ok {
		t.Skip("the store does not implement idemkeys.Lister")
	}
	lister := func(h *harness) idemkeys.Lister { return h.fx.Store.(idemkeys.Lister) }

	s.parallel(t, "Statuses", func(h *harness) {
		st := h.fx.Store
		want := map[idemkeys.Status][]string{}
		// Claimed first, so that its end of lease and retention are
		// behind by the time the sleep below is over.
		p := h.params("expired", nil)
		p.Lease, p.Retention = shortLease, shortLease
		h.mustWin(st, p)
		h.mustComplete(st, p.Key, p.Token, idem.Result{Status: 201})
		if !h.caps.SelfExpiring {
			want[idemkeys.Expired] = []string{p.Key}
		}
		p = h.params("abandoned", nil)
		p.Lease = shortLease
		h.mustWin(st, p)
		want[idemkeys.Abandoned] = []string{p.Key}
		sleepPast(h.t, time.Now(), shortLease)

		h.mustWin(st, h.params("in-flight", nil))
		want[idemkeys.InFlight] = []string{"in-flight"}
		p = h.params("complete", nil)
		h.mustWin(st, p)
		h.mustComplete(st, p.Key, p.Token, idem.Result{Status: 200, Body: []byte("the body")})
		want[idemkeys.Complete] = []string{"complete"}

		for _, status := range []idemkeys.Status{idemkeys.InFlight, idemkeys.Abandoned, idemkeys.Complete, idemkeys.Expired} {
			page, err := lister(h).ListKeys(h.ctx, idemkeys.ListParams{Tenant: h.tenant, Status: status})
			if err != nil {
				h.t.Fatalf("ListKeys(%s): %v", status, err)
			}
			var got []string
			for _, rec := range page.Records {
				got = append(got, rec.Key)
				if idemkeys.StatusOf(rec, page.Now) != status {
					h.t.Errorf("ListKeys(%s) returned %q, whose status at the page's Now is %s", status, rec.Key, idemkeys.StatusOf(rec, page.Now))
				}
				if rec.Result.Body != nil {
					h.t.Errorf("ListKeys returned %q with its body; a listed record carries none", rec.Key)
				}
			}
			if !slices.Equal(got, want[status]) {
				h.t.Errorf("ListKeys(%s) = %q, want %q", status, got, want[status])
			}
			if page.Next != "" {
				h.t.Errorf("ListKeys(%s) of one record gave a next page", status)
			}
		}

		stats, err := lister(h).KeyStats(h.ctx, idemkeys.StatsParams{Tenant: h.tenant})
		if err != nil {
			h.t.Fatalf("KeyStats: %v", err)
		}
		wantCounts := idemkeys.TenantCounts{Tenant: h.tenant, InFlight: 1, Abandoned: 1, Complete: 1, Expired: len(want[idemkeys.Expired])}
		if len(stats.Tenants) != 1 || stats.Tenants[0] != wantCounts {
			h.t.Errorf("KeyStats(%q).Tenants = %+v, want [%+v]", h.tenant, stats.Tenants, wantCounts)
		}
		if stats.OldestInFlight == nil || stats.OldestInFlight.Key != "abandoned" {
			h.t.Errorf("KeyStats.OldestInFlight = %s, want the abandoned record (claimed before the live one)", describe(stats.OldestInFlight))
		}
		if len(stats.Hours) != 24 {
			h.t.Fatalf("KeyStats.Hours has %d hours, want 24", len(stats.Hours))
		}
		claims, completions := 0, 0
		for i, hour := range stats.Hours {
			claims += hour.Claims
			completions += hour.Completions
			if i > 0 && !hour.Start.Equal(stats.Hours[i-1].Start.Add(time.Hour)) {
				h.t.Errorf("KeyStats.Hours[%d] starts at %s, an hour after %s wanted", i, hour.Start, stats.Hours[i-1].Start)
			}
		}
		if last := stats.Hours[23].Start; stats.Now.Before(last) || !stats.Now.Before(last.Add(time.Hour)) {
			h.t.Errorf("the last hour starts at %s; Now %s is not in it", last, stats.Now)
		}
		if wantClaims := 3 + len(want[idemkeys.Expired]); claims != wantClaims || completions != 1+len(want[idemkeys.Expired]) {
			h.t.Errorf("KeyStats.Hours count %d claims and %d completions, want %d and %d", claims, completions, wantClaims, 1+len(want[idemkeys.Expired]))
		}
	})

	s.parallel(t, "Pages", func(h *harness) {
		st := h.fx.Store
		var want []string
		for i := range 7 {
			key := "order-" + strconv.Itoa(i)
			h.mustWin(st, h.params(key, nil))
			want = append(want, key)
		}
		h.mustWin(st, h.params("other-0", nil))
		// Another tenant with the same keys: never listed with this one.
		other := h.withTenant(newName("tenant"))
		other.mustWin(st, other.params("order-0", nil))

		var got []string
		var after string
		for pages := 1; ; pages++ {
			page, err := lister(h).ListKeys(h.ctx, idemkeys.ListParams{Tenant: h.tenant, Prefix: "order-", Limit: 3, After: after})
			if err != nil {
				h.t.Fatalf("ListKeys page %d: %v", pages, err)
			}
			if len(page.Records) > 3 {
				h.t.Fatalf("ListKeys(Limit: 3) returned %d records", len(page.Records))
			}
			for _, rec := range page.Records {
				if rec.Tenant != h.tenant {
					h.t.Errorf("ListKeys(Tenant: %q) returned a record of tenant %q", h.tenant, rec.Tenant)
				}
				got = append(got, rec.Key)
			}
			if page.Next == "" {
				break
			}
			if pages > 10 {
				h.t.Fatal("ListKeys keeps returning a next page")
			}
			after = page.Next
		}
		// Claimed one after the other, the keys come back in claim order
		// except where two claims share a timestamp: compare as sets,
		// order checked by the cursor not repeating or losing any.
		slices.Sort(got)
		if !slices.Equal(got, want) {
			h.t.Errorf("pages of ListKeys(Prefix: order-) gave %q, want %q", got, want)
		}

		// A time range that ends before every claim lists nothing.
		page, err := lister(h).ListKeys(h.ctx, idemkeys.ListParams{Tenant: h.tenant, CreatedBefore: time.Now().Add(-time.Hour)})
		if err != nil {
			h.t.Fatalf("ListKeys(CreatedBefore): %v", err)
		}
		if len(page.Records) != 0 {
			h.t.Errorf("ListKeys(CreatedBefore an hour ago) returned %d records claimed just now", len(page.Records))
		}
		page, err = lister(h).ListKeys(h.ctx, idemkeys.ListParams{Tenant: h.tenant, CreatedFrom: time.Now().Add(-time.Hour), Limit: 100})
		if err != nil {
			h.t.Fatalf("ListKeys(CreatedFrom): %v", err)
		}
		if len(page.Records) != 8 {
			h.t.Errorf("ListKeys(CreatedFrom an hour ago) returned %d records, want 8", len(page.Records))
		}
		if _, err := lister(h).ListKeys(h.ctx, idemkeys.ListParams{After: "not a cursor"}); err == nil {
			h.t.Error("ListKeys accepted a cursor it never wrote")
		}
		if _, err := lister(h).ListKeys(h.ctx, idemkeys.ListParams{Status: "stuck"}); err == nil {
			h.t.Error("ListKeys accepted an unknown status")
		}
	})

	s.parallel(t, "ReleaseByToken", func(h *harness) {
		st := h.fx.Store
		p := h.params("stuck", fingerprint("a"))
		h.mustWin(st, p)
		page, err := lister(h).ListKeys(h.ctx, idemkeys.ListParams{Tenant: h.tenant, Status: idemkeys.InFlight})
		if err != nil || len(page.Records) != 1 {
			h.t.Fatalf("ListKeys(in_flight) = %d records, %v; want the one claimed", len(page.Records), err)
		}
		token := page.Records[0].LeaseToken
		if token != p.Token {
			h.t.Fatalf("listed lease token %d, want %d", token, p.Token)
		}
		if err := st.Release(h.ctx, idem.ReleaseParams{Tenant: h.tenant, Key: "stuck", Token: token}); err != nil {
			h.t.Fatalf("Release: %v", err)
		}
		// The retry runs at once, and the old holder cannot complete.
		retry := h.params("stuck", fingerprint("a"))
		h.mustWin(st, retry)
		if err := h.complete(st, "stuck", p.Token, idem.Result{Status: 201}); !errors.Is(err, idem.ErrLeaseLost) {
			h.t.Errorf("completion by the released holder: %v, want ErrLeaseLost", err)
		}
		h.mustComplete(st, "stuck", retry.Token, idem.Result{Status: 201})
	})

	s.parallel(t, "Forget", func(h *harness) {
		st := h.fx.Store
		p := h.params("done", fingerprint("a"))
		h.mustWin(st, p)
		if err := lister(h).Forget(h.ctx, idemkeys.ForgetParams{Tenant: h.tenant, Key: "done", Token: p.Token}); !errors.Is(err, idem.ErrNotFound) {
			h.t.Errorf("Forget of a key in flight: %v, want ErrNotFound", err)
		}
		h.mustBeInFlight(st, "done", p.Token)
		h.mustComplete(st, "done", p.Token, idem.Result{Status: 201})
		if err := lister(h).Forget(h.ctx, idemkeys.ForgetParams{Tenant: h.tenant, Key: "done", Token: p.Token + 1}); !errors.Is(err, idem.ErrNotFound) {
			h.t.Errorf("Forget under another token: %v, want ErrNotFound", err)
		}
		if err := lister(h).Forget(h.ctx, idemkeys.ForgetParams{Tenant: h.tenant, Key: "done", Token: p.Token}); err != nil {
			h.t.Fatalf("Forget: %v", err)
		}
		h.mustBeAbsent(st, "done")
		h.mustWin(st, h.params("done", fingerprint("a")))
		if err := lister(h).Forget(h.ctx, idemkeys.ForgetParams{Tenant: h.tenant, Key: "never", Token: 1}); !errors.Is(err, idem.ErrNotFound) {
			h.t.Errorf("Forget of an absent key: %v, want ErrNotFound", err)
		}
	})
}
