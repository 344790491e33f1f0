package reliability

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"testing"
)

// TestTenantIsolation: two tenants, each served by its own process on the
// shared database, use the same key names.
//
//   - the same key under two tenants names two operations: both run, each
//     tenant gets its own answer back, never the other's;
//   - duplicates of both at the same instant run once per tenant;
//   - tenant B cannot tell whether tenant A used a key: B's answer for a key
//     A completed, holds in flight, or used with another body has the same
//     status, the same header names and the same body shape as for a key
//     nobody used, and goes through the same store operations (claim won,
//     begin, complete), none of which touches A's tenant. The path is the
//     timing class: same operations, same statements, whatever A did.
//
// Mutant shared-tenant (every caller in one tenant) fails it.
func TestTenantIsolation(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *database) {
		ctx := context.Background()
		shared := newEntries()
		var held *gate
		holding := make(chan struct{}, 1)
		hold := func(w http.ResponseWriter, r *http.Request, o order, id int64) bool {
			if o.Item == "hold" {
				holding <- struct{}{}
				<-held.ch
			}
			return false
		}
		a := newStack(t, db, stackConfig{shared: shared, hook: hold})
		b := newStack(t, db, stackConfig{shared: shared})

		t.Run("same key, two tenants", func(t *testing.T) {
			fa := a.order(ctx, "acme", "k1", "tea")
			fb := b.order(ctx, "globex", "k1", "tea")
			if fa.status != http.StatusCreated || fb.status != http.StatusCreated || fa.replayed() || fb.replayed() {
				t.Fatalf("acme %v, globex %v: want two fresh executions", fa, fb)
			}
			for _, p := range []*stack{a, b} {
				if r := p.order(ctx, "acme", "k1", "tea"); !bytes.Equal(r.body, fa.body) {
					t.Errorf("acme's replay %v, want %q", r, fa.body)
				}
				if r := p.order(ctx, "globex", "k1", "tea"); !bytes.Equal(r.body, fb.body) {
					t.Errorf("globex's replay %v, want %q", r, fb.body)
				}
			}
			wantOneOrderEach(t, db, "k1")
		})

		t.Run("same key, two tenants, same instant", func(t *testing.T) {
			const n = 8
			barrier := make(chan struct{})
			type res struct {
				tenant string
				a      answer
			}
			out := make([]res, 2*n)
			var wg sync.WaitGroup
			for i := range 2 * n {
				tenant, p := "acme", a
				if i%2 == 1 {
					tenant, p = "globex", b
				}
				wg.Go(func() {
					<-barrier
					out[i] = res{tenant, p.order(ctx, tenant, "k2", "tea")}
				})
			}
			close(barrier)
			wg.Wait()
			fresh := map[string]int{}
			bodies := map[string][]byte{}
			for _, r := range out {
				switch {
				case r.a.status == http.StatusConflict && r.a.problem() == "in-flight":
				case r.a.status == http.StatusCreated:
					if !r.a.replayed() {
						fresh[r.tenant]++
					}
					if tenantIn(t, r.a) != r.tenant {
						t.Errorf("%s got %s's answer %v", r.tenant, tenantIn(t, r.a), r.a)
					}
					if prev, ok := bodies[r.tenant]; ok && !bytes.Equal(prev, r.a.body) {
						t.Errorf("%s got two different answers", r.tenant)
					}
					bodies[r.tenant] = r.a.body
				default:
					t.Errorf("%s: %v", r.tenant, r.a)
				}
			}
			if fresh["acme"] != 1 || fresh["globex"] != 1 {
				t.Errorf("fresh answers %v, want one per tenant", fresh)
			}
			for _, tenant := range []string{"acme", "globex"} {
				if n := shared.get(tenant, "k2"); n != 1 {
					t.Errorf("%s: handler ran %d times, want 1", tenant, n)
				}
			}
			wantOneOrderEach(t, db, "k2")
		})

		t.Run("no oracle", func(t *testing.T) {
			// What B sees for keys nobody used: the baseline.
			b.store.takeLog()
			unused := b.order(ctx, "globex", "unused-1", "tea")
			baseOps := b.store.takeLog()
			unusedOther := b.order(ctx, "globex", "unused-2", "coffee")
			b.store.takeLog()

			// A completes a key; B uses it with the same body, then another
			// completed key with another body.
			if r := a.order(ctx, "acme", "used-1", "tea"); r.status != http.StatusCreated {
				t.Fatal(r)
			}
			if r := a.order(ctx, "acme", "used-2", "tea"); r.status != http.StatusCreated {
				t.Fatal(r)
			}
			b.store.takeLog()
			probes := map[string]answer{}
			ops := map[string][]storeOp{}
			probes["completed, same body"] = b.order(ctx, "globex", "used-1", "tea")
			ops["completed, same body"] = b.store.takeLog()
			probes["completed, other body"] = b.order(ctx, "globex", "used-2", "coffee")
			ops["completed, other body"] = b.store.takeLog()

			// A holds a key in flight while B uses it. On SQLite A's open
			// transaction holds the database-wide write lock, so B's claim
			// waits for it, as it would for any key of any tenant; A is let
			// go once B is inside its claim.
			held = newGate()
			defer held.open()
			aDone := make(chan answer, 1)
			go func() { aDone <- a.order(ctx, "acme", "held-1", "hold") }()
			<-holding // acme's execution holds its key
			bDone := make(chan answer, 1)
			go func() { bDone <- b.order(ctx, "globex", "held-1", "hold") }()
			if db.name == "sqlite" {
				eventually(t, "globex's claim", func() bool { return b.store.inClaim() > 0 })
				held.open()
			}
			probes["in flight"] = <-bDone
			ops["in flight"] = b.store.takeLog()
			held.open()
			if r := <-aDone; r.status != http.StatusCreated {
				t.Errorf("acme's held request: %v", r)
			}

			for name, p := range probes {
				base := unused
				if name == "completed, other body" {
					base = unusedOther
				}
				sameShape(t, name, p, base)
				if !slices.EqualFunc(ops[name], baseOps, sameOp) {
					t.Errorf("%s: store operations %v, for an unused key %v", name, ops[name], baseOps)
				}
				for _, op := range ops[name] {
					if op.tenant != "" && op.tenant != "globex" {
						t.Errorf("%s: operation %v touched another tenant", name, op)
					}
				}
			}
		})
	})
}

// sameOp compares store operations apart from the key they name.
func sameOp(x, y storeOp) bool { return x.op == y.op && x.won == y.won && x.tenant == y.tenant }

// sameShape checks that probe looks like base to its client: status,
// replay marker, header names, JSON field names.
func sameShape(t *testing.T, name string, probe, base answer) {
	t.Helper()
	if probe.status != base.status || probe.replayed() != base.replayed() {
		t.Errorf("%s: %v, for an unused key %v", name, probe, base)
		return
	}
	names := func(h http.Header) []string {
		var out []string
		for k := range h {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(names(probe.header), names(base.header)) {
		t.Errorf("%s: header names %v, for an unused key %v", name, names(probe.header), names(base.header))
	}
	fields := func(b []byte) []string {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Errorf("%s: body %q: %v", name, b, err)
		}
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(fields(probe.body), fields(base.body)) {
		t.Errorf("%s: body fields %v, for an unused key %v", name, fields(probe.body), fields(base.body))
	}
}

func tenantIn(t *testing.T, a answer) string {
	t.Helper()
	var b struct {
		Tenant string `json:"tenant"`
	}
	if err := json.Unmarshal(a.body, &b); err != nil {
		t.Fatalf("body %q: %v", a.body, err)
	}
	return b.Tenant
}

// wantOneOrderEach checks that key holds exactly one order per tenant.
func wantOneOrderEach(t *testing.T, db *database, key string) {
	t.Helper()
	for _, tenant := range []string{"acme", "globex"} {
		if o := db.ordersOf(t, tenant, key); len(o) != 1 {
			t.Errorf("%s: %d orders under %q, want 1", tenant, len(o), key)
		}
	}
}
