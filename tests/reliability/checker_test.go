package reliability

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

// exchange is one request of a workload and the answer it got.
type exchange struct {
	proc              int
	tenant, key, item string
	a                 answer
}

// journal records every exchange of a workload, from any goroutine.
type journal struct {
	mu sync.Mutex
	ex []exchange
}

// send posts an order through s and records the exchange.
func (j *journal) send(ctx context.Context, proc int, s *stack, tenant, key, item string) answer {
	a := s.order(ctx, tenant, key, item)
	j.mu.Lock()
	j.ex = append(j.ex, exchange{proc: proc, tenant: tenant, key: key, item: item, a: a})
	j.mu.Unlock()
	return a
}

func (j *journal) all() []exchange {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]exchange(nil), j.ex...)
}

// tally is what a checked workload did, for the logs and docs.
type tally struct {
	requests, keys, orders, fresh, replays int
	byProblem                              map[string]int
}

func (t tally) String() string {
	var probs []string
	for slug, n := range t.byProblem {
		probs = append(probs, fmt.Sprintf("%s=%d", slug, n))
	}
	sort.Strings(probs)
	return fmt.Sprintf("%d requests on %d keys: %d orders, %d fresh 201, %d replays; problems: %s",
		t.requests, t.keys, t.orders, t.fresh, t.replays, strings.Join(probs, " "))
}

// checkRules says what a workload may legitimately answer.
type checkRules struct {
	// problems are the problem slugs (or full types) a request may get.
	problems map[string]bool
	// exactlyOnce, when set, requires exactly one handler entry per key
	// (no fault can have made an execution roll back); otherwise handler
	// entries are only bounded by won claims.
	exactlyOnce bool
	// allDone requires every key to have ended with a 2xx answer.
	allDone bool
}

// checkInvariants checks a finished workload against the database and
// the counters of its processes:
//
//   - every non-2xx answer is a problem+json the rules allow;
//   - per (tenant, key): at most one order, exactly one if any request got
//     a 2xx; every 2xx answer byte-identical (status, Location, body) and
//     naming that order's id; at most one of them fresh; no 2xx to a
//     request whose body differs from the executed one;
//   - no handler entry without a won claim for the same (tenant, key), and
//     exactly one entry per key when rules.exactlyOnce;
//   - every order traceable to exactly one key of the workload, and that
//     key's record complete; every complete 2xx record has its one order;
//   - no record left in flight.
func checkInvariants(t *testing.T, db *database, ex []exchange, ent *entries, stores []*countingStore, rules checkRules) tally {
	t.Helper()
	type tk = [2]string
	groups := make(map[tk][]exchange)
	var order []tk
	tl := tally{requests: len(ex), byProblem: make(map[string]int)}
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf(format, args...)
	}
	for _, e := range ex {
		k := tk{e.tenant, e.key}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], e)
		switch {
		case e.a.err != nil:
			fail("(%s, %s) proc %d: transport error %v", e.tenant, e.key, e.proc, e.a.err)
		case e.a.status >= 200 && e.a.status < 300:
		default:
			slug := e.a.problem()
			tl.byProblem[slug]++
			if !rules.problems[slug] {
				fail("(%s, %s) proc %d: unexpected answer %v", e.tenant, e.key, e.proc, e.a)
			}
		}
	}
	tl.keys = len(groups)

	orders := make(map[tk][]orderRow)
	for _, o := range db.orders(t) {
		k := tk{o.tenant, o.key}
		if _, ok := groups[k]; !ok {
			fail("order %d (%s, %s, %q) belongs to no key of the workload", o.id, o.tenant, o.key, o.item)
		}
		orders[k] = append(orders[k], o)
		tl.orders++
	}
	records := make(map[tk]recordRow)
	for _, r := range db.records(t) {
		records[tk{r.tenant, r.key}] = r
		if r.state != string(idem.StateComplete) {
			fail("record (%s, %s) left %s", r.tenant, r.key, r.state)
		}
	}

	for _, k := range order {
		g := groups[k]
		os := orders[k]
		if len(os) > 1 {
			fail("(%s, %s): %d orders %v, want at most one", k[0], k[1], len(os), os)
			continue
		}
		var first *answer
		fresh := 0
		for i := range g {
			e := &g[i]
			if e.a.err != nil || e.a.status < 200 || e.a.status >= 300 {
				continue
			}
			if e.a.replayed() {
				tl.replays++
			} else {
				fresh++
				tl.fresh++
			}
			if len(os) == 0 {
				fail("(%s, %s): answered %v but no order exists", k[0], k[1], e.a)
				continue
			}
			if e.item != os[0].item {
				fail("(%s, %s): a request for %q got %v, but %q was executed", k[0], k[1], e.item, e.a, os[0].item)
			}
			if first == nil {
				first = &e.a
				if id := idOf(t, e.a); id != os[0].id {
					fail("(%s, %s): answer names order %d, the order is %d", k[0], k[1], id, os[0].id)
				}
				continue
			}
			if e.a.status != first.status || e.a.header.Get("Location") != first.header.Get("Location") || !bytes.Equal(e.a.body, first.body) {
				fail("(%s, %s): answers differ:\n  %v\n  %v", k[0], k[1], *first, e.a)
			}
		}
		if fresh > 1 {
			fail("(%s, %s): %d fresh answers, want at most one", k[0], k[1], fresh)
		}
		if first == nil && len(os) > 0 && rules.allDone {
			fail("(%s, %s): an order exists but no request got a 2xx", k[0], k[1])
		}
		if rules.allDone && first == nil {
			fail("(%s, %s): no request ended with a 2xx", k[0], k[1])
		}
		if len(os) == 1 {
			if r, ok := records[k]; !ok || r.state != string(idem.StateComplete) || r.status != http.StatusCreated {
				fail("(%s, %s): order %d has no completed 201 record (%+v)", k[0], k[1], os[0].id, r)
			}
		}
		if r, ok := records[k]; ok && r.state == string(idem.StateComplete) && r.status >= 200 && r.status < 300 && len(os) != 1 {
			fail("(%s, %s): a completed %d record but %d orders", k[0], k[1], r.status, len(os))
		}
		won := 0
		for _, s := range stores {
			won += s.wonClaims(k[0], k[1])
		}
		n := ent.get(k[0], k[1])
		if n > won {
			fail("(%s, %s): the handler ran %d times on %d won claims", k[0], k[1], n, won)
		}
		if rules.exactlyOnce && len(os) == 1 && n != 1 {
			fail("(%s, %s): the handler ran %d times, want exactly once", k[0], k[1], n)
		}
	}
	for k := range records {
		if _, ok := groups[k]; !ok {
			fail("record (%s, %s) belongs to no key of the workload", k[0], k[1])
		}
	}
	return tl
}
