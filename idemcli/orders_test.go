package idemcli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/internal/testenv"
)

const goodOrder = `{"cart_id":"c_42","total_cents":1900}`

func decodeOrderBody(t *testing.T, a answer) order {
	t.Helper()
	var o order
	if err := json.Unmarshal(a.body, &o); err != nil {
		t.Fatalf("order body %q: %v", a.body, err)
	}
	return o
}

// checkProblem checks that a is an RFC 9457 problem with status and the
// type slug, and returns its detail.
func checkProblem(t *testing.T, a answer, status int, slug string) string {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d: %s", a.status, status, a)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json: %s", ct, a)
	}
	var p struct {
		Type   string `json:"type"`
		Title  string `json:"title"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal(a.body, &p); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	if p.Status != status || p.Title == "" || p.Detail == "" {
		t.Errorf("problem %+v: want status %d, a title and a detail", p, status)
	}
	if slug != "" && !strings.HasSuffix(p.Type, "#"+slug) {
		t.Errorf("problem type %q, want the slug %q", p.Type, slug)
	}
	return p.Detail
}

// TestOrdersOnEachDatabase runs the API's main paths on SQLite, PostgreSQL
// and MariaDB: the per-dialect schema and queries of the demo.
func TestOrdersOnEachDatabase(t *testing.T) {
	for _, kind := range dbKinds {
		t.Run(kind.name, func(t *testing.T) {
			s, ts := startServer(t, ServeOpts{DB: kind.fresh(t)})
			url := ts.URL + "/orders"

			// The seed's test, 20 duplicates at once.
			reqs := make([]req, 20)
			for i := range reqs {
				reqs[i] = req{method: "POST", url: url, body: goodOrder, key: "seed-key"}
			}
			first := checkOneEffect(t, fireTogether(reqs))
			o := decodeOrderBody(t, first)
			if o.CartID != "c_42" || o.TotalCents != 1900 || !strings.HasPrefix(o.ID, "ord_") || o.CreatedAt.IsZero() {
				t.Fatalf("created order %+v", o)
			}
			if loc := first.header.Get("Location"); loc != "/orders/"+o.ID {
				t.Fatalf("Location %q, want /orders/%s", loc, o.ID)
			}

			// A second order in the same cart, another key.
			second := do(t, req{method: "POST", url: url, body: `{"cart_id":"c_42","total_cents":500}`, key: "other-key"})
			if second.status != http.StatusCreated {
				t.Fatalf("second order: %s", second)
			}
			o2 := decodeOrderBody(t, second)

			list := do(t, req{method: "GET", url: url + "?cart_id=c_42"})
			var got []order
			if err := json.Unmarshal(list.body, &got); err != nil || list.status != http.StatusOK {
				t.Fatalf("list: %s (%v)", list, err)
			}
			if len(got) != 2 || !sameOrder(got[0], o) && !sameOrder(got[1], o) {
				t.Fatalf("list = %+v, want %+v and %+v", got, o, o2)
			}
			if total := list.header.Get("X-Total-Count"); total != "2" {
				t.Fatalf("X-Total-Count %q, want 2", total)
			}
			// Text no database can hold, or no order id can be: refused
			// or not found, never a 500.
			checkProblem(t, do(t, req{method: "GET", url: url + "?cart_id=%ff"}), http.StatusBadRequest, "invalid-order")
			checkProblem(t, do(t, req{method: "GET", url: url + "?cart_id=a%00b"}), http.StatusBadRequest, "invalid-order")
			checkProblem(t, do(t, req{method: "GET", url: url + "/%ff"}), http.StatusNotFound, "order-not-found")
			checkProblem(t, do(t, req{method: "GET", url: url + "/a%00b"}), http.StatusNotFound, "order-not-found")
			n, err := s.app.repo.count(context.Background(), DefaultTenant, "c_42")
			if err != nil || n != 2 {
				t.Fatalf("count = %d, %v; want 2", n, err)
			}
			if other := do(t, req{method: "GET", url: url + "?cart_id=c_43"}); string(other.body) != "[]\n" {
				t.Fatalf("empty cart: %s, want []", other)
			}

			one := do(t, req{method: "GET", url: url + "/" + o.ID})
			if one.status != http.StatusOK || !sameOrder(decodeOrderBody(t, one), o) {
				t.Fatalf("GET /orders/%s = %s, want %+v", o.ID, one, o)
			}
			// The POST's answer and the GET's show the same instant.
			if string(one.body) != string(first.body) {
				t.Fatalf("GET body %q differs from the POST body %q", one.body, first.body)
			}
			checkProblem(t, do(t, req{method: "GET", url: url + "/ord_missing"}), http.StatusNotFound, "order-not-found")
		})
	}
}

func sameOrder(a, b order) bool {
	return a.ID == b.ID && a.CartID == b.CartID && a.TotalCents == b.TotalCents && a.CreatedAt.Equal(b.CreatedAt)
}

func TestOrdersInvalidBody(t *testing.T) {
	s, ts := startServer(t, ServeOpts{DB: sqliteDB(t)})
	url := ts.URL + "/orders"
	cases := []struct {
		name, body, detail string
	}{
		{"empty", "", "empty"},
		{"not json", "cart_id=c_42", "not valid JSON"},
		{"truncated", `{"cart_id":"c_42"`, "not valid JSON"},
		{"array", `[1,2]`, "JSON object"},
		{"missing cart_id", `{"total_cents":1900}`, `"cart_id" is missing`},
		{"empty cart_id", `{"cart_id":"","total_cents":1900}`, `"cart_id" is empty`},
		{"long cart_id", `{"cart_id":"` + strings.Repeat("c", 256) + `","total_cents":1900}`, "limit is 255"},
		{"cart_id number", `{"cart_id":42,"total_cents":1900}`, `"cart_id" must be a string`},
		{"cart_id null", `{"cart_id":null,"total_cents":1900}`, `"cart_id" is missing`},
		{"missing total", `{"cart_id":"c_42"}`, `"total_cents" is missing`},
		{"total string", `{"cart_id":"c_42","total_cents":"1900"}`, `"total_cents" must be an integer`},
		{"total float", `{"cart_id":"c_42","total_cents":19.5}`, `"total_cents" must be an integer`},
		{"total negative", `{"cart_id":"c_42","total_cents":-1}`, "negative"},
		{"total too large", `{"cart_id":"c_42","total_cents":9007199254740992}`, "larger than"},
		{"unknown field", `{"cart_id":"c_42","total_cents":1900,"coupon":"X"}`, `unknown field "coupon"`},
		{"two objects", goodOrder + goodOrder, "goes on after"},
		{"field in capitals", `{"CART_ID":"c_42","total_cents":1900}`, `unknown field "CART_ID"`},
		{"field twice", `{"cart_id":"c_1","cart_id":"c_42","total_cents":1900}`, `"cart_id" appears twice`},
		{"NUL in cart_id", `{"cart_id":"c\u0000_42","total_cents":1900}`, "control character"},
		{"newline in cart_id", `{"cart_id":"c\n42","total_cents":1900}`, "control character"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := do(t, req{method: "POST", url: url, body: c.body, contentType: "application/json"})
			if detail := checkProblem(t, a, http.StatusBadRequest, "invalid-order"); !strings.Contains(detail, c.detail) {
				t.Errorf("detail %q does not say %q", detail, c.detail)
			}
		})
	}
	checkProblem(t, do(t, req{method: "POST", url: url, body: goodOrder, contentType: "text/plain"}), http.StatusUnsupportedMediaType, "unsupported-media-type")
	huge := `{"cart_id":"c_42","total_cents":1900,"pad":"` + strings.Repeat("x", maxOrderBody) + `"}`
	checkProblem(t, do(t, req{method: "POST", url: url, body: huge}), http.StatusRequestEntityTooLarge, "order-too-large")
	if a := do(t, req{method: "POST", url: url, body: goodOrder, contentType: "application/json; charset=utf-8"}); a.status != http.StatusCreated {
		t.Fatalf("JSON with a charset: %s", a)
	}
	if n, err := s.app.repo.count(context.Background(), DefaultTenant, "c_42"); err != nil || n != 1 {
		t.Fatalf("%d orders after the refused bodies and one good one (%v), want 1", n, err)
	}

	// Under a key, the handler's 400 is an answer like any other: stored
	// and replayed, so a client retrying a bad request learns nothing new.
	bad := req{method: "POST", url: url, body: `{"cart_id":"c_42"}`, key: "bad-body"}
	first := do(t, bad)
	checkProblem(t, first, http.StatusBadRequest, "invalid-order")
	again := do(t, bad)
	if again.status != http.StatusBadRequest || !again.replayed() || string(again.body) != string(first.body) {
		t.Fatalf("retry of a 400: %s replayed=%v, want the same 400 replayed", again, again.replayed())
	}
}

func TestOrdersRouting(t *testing.T) {
	_, ts := startServer(t, ServeOpts{DB: sqliteDB(t)})
	a := do(t, req{method: "DELETE", url: ts.URL + "/orders"})
	checkProblem(t, a, http.StatusMethodNotAllowed, "method-not-allowed")
	if allow := a.header.Get("Allow"); !strings.Contains(allow, "POST") {
		t.Errorf("Allow %q", allow)
	}
	checkProblem(t, do(t, req{method: "PUT", url: ts.URL + "/orders/ord_1", body: goodOrder}), http.StatusMethodNotAllowed, "method-not-allowed")
	checkProblem(t, do(t, req{method: "GET", url: ts.URL + "/nothing"}), http.StatusNotFound, "not-found")
}

// TestOrdersMalformedAuthorization: a malformed Authorization is refused
// with 401 in front of the idempotency layer, so nothing is stored under
// the key and the same key works once the caller is authenticated.
func TestOrdersMalformedAuthorization(t *testing.T) {
	s, ts := startServer(t, ServeOpts{DB: sqliteDB(t)})
	url := ts.URL + "/orders"
	for _, auth := range []string{"Basic YWxpY2U6cHc=", "Bearer", "Bearer ", "Bearer a b", "Bearer al!ce", "bearer" + strings.Repeat("x", 200), "Bearer " + strings.Repeat("x", 129)} {
		a := do(t, req{method: "POST", url: url, body: goodOrder, key: "k-auth", auth: auth})
		checkProblem(t, a, http.StatusUnauthorized, "unauthenticated")
		if a.header.Get("WWW-Authenticate") == "" {
			t.Errorf("401 for %q without WWW-Authenticate", auth)
		}
	}
	// Two Authorization fields: which one is the caller?
	hr, _ := http.NewRequest("POST", url, strings.NewReader(goodOrder))
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Idempotency-Key", "k-auth")
	hr.Header.Add("Authorization", "Bearer alice")
	hr.Header.Add("Authorization", "Bearer bob")
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("two Authorization fields: %d, want 401", resp.StatusCode)
	}

	for _, tenant := range []string{DefaultTenant, "alice", "bob"} {
		if _, err := s.store.Get(context.Background(), tenant, "k-auth"); !errors.Is(err, idem.ErrNotFound) {
			t.Fatalf("record for tenant %q after 401s: %v, want ErrNotFound", tenant, err)
		}
	}
	a := do(t, req{method: "POST", url: url, body: goodOrder, key: "k-auth", auth: "Bearer alice"})
	if a.status != http.StatusCreated || a.replayed() {
		t.Fatalf("first authenticated request: %s replayed=%v, want a fresh 201", a, a.replayed())
	}
	if n, _ := s.app.repo.count(context.Background(), "alice", "c_42"); n != 1 {
		t.Fatalf("alice has %d orders, want 1", n)
	}
}

// TestOrdersTenantScoping: one key under two tenants, sent at the same
// instant, is two operations; each tenant sees only its own order.
func TestOrdersTenantScoping(t *testing.T) {
	for _, kind := range dbKinds[:2] {
		t.Run(kind.name, func(t *testing.T) {
			s, ts := startServer(t, ServeOpts{DB: kind.fresh(t)})
			url := ts.URL + "/orders"
			var reqs []req
			for range 10 {
				reqs = append(reqs,
					req{method: "POST", url: url, body: goodOrder, key: "shared-key", auth: "Bearer alice"},
					req{method: "POST", url: url, body: goodOrder, key: "shared-key", auth: "Bearer bob"})
			}
			answers := fireTogether(reqs)
			var alice, bob []answer
			for i, a := range answers {
				if i%2 == 0 {
					alice = append(alice, a)
				} else {
					bob = append(bob, a)
				}
			}
			aOrder := decodeOrderBody(t, checkOneEffect(t, alice))
			bOrder := decodeOrderBody(t, checkOneEffect(t, bob))
			if aOrder.ID == bOrder.ID {
				t.Fatalf("both tenants got order %s", aOrder.ID)
			}
			for tenant, want := range map[string]order{"alice": aOrder, "bob": bOrder} {
				auth := "Bearer " + tenant
				replay := do(t, req{method: "POST", url: url, body: goodOrder, key: "shared-key", auth: auth})
				if !replay.replayed() || decodeOrderBody(t, replay).ID != want.ID {
					t.Fatalf("%s's replay: %s, want its own order %s", tenant, replay, want.ID)
				}
				list := do(t, req{method: "GET", url: url + "?cart_id=c_42", auth: auth})
				var got []order
				if err := json.Unmarshal(list.body, &got); err != nil || len(got) != 1 || got[0].ID != want.ID {
					t.Fatalf("%s's list: %s, want only %s", tenant, list, want.ID)
				}
				if n, _ := s.app.repo.count(context.Background(), tenant, "c_42"); n != 1 {
					t.Fatalf("%s has %d orders, want 1", tenant, n)
				}
			}
			checkProblem(t, do(t, req{method: "GET", url: url + "/" + bOrder.ID, auth: "Bearer alice"}), http.StatusNotFound, "order-not-found")
			if n, _ := s.app.repo.count(context.Background(), DefaultTenant, "c_42"); n != 0 {
				t.Fatalf("the default tenant has %d orders, want 0", n)
			}
		})
	}
}

// TestOrdersRedisKeys: with --keys redis://…, the records live in Redis and
// the orders in SQLite; duplicates sent together still make one order.
func TestOrdersRedisKeys(t *testing.T) {
	s, ts := startServer(t, ServeOpts{DB: sqliteDB(t), Keys: testenv.RedisURL(t), Retention: time.Minute})
	if _, ok := s.store.(*idemredis.Store); !ok {
		t.Fatalf("store %T, want *idemredis.Store", s.store)
	}
	key := testenv.Name() // the Redis server is shared: a key of this test's own
	reqs := make([]req, 20)
	for i := range reqs {
		reqs[i] = req{method: "POST", url: ts.URL + "/orders", body: goodOrder, key: key}
	}
	checkOneEffect(t, fireTogether(reqs))
	if n, err := s.app.repo.count(context.Background(), DefaultTenant, "c_42"); err != nil || n != 1 {
		t.Fatalf("%d orders (%v), want 1", n, err)
	}
	if _, err := s.store.Get(context.Background(), DefaultTenant, key); err != nil {
		t.Fatalf("no record in Redis: %v", err)
	}
}

func TestOrdersRequireKey(t *testing.T) {
	_, ts := startServer(t, ServeOpts{DB: sqliteDB(t), RequireKey: true})
	checkProblem(t, do(t, req{method: "POST", url: ts.URL + "/orders", body: goodOrder}), http.StatusBadRequest, "key-required")
	if a := do(t, req{method: "POST", url: ts.URL + "/orders", body: goodOrder, key: "k1"}); a.status != http.StatusCreated {
		t.Fatalf("with a key: %s", a)
	}
	// GETs are not covered by the layer: no key needed.
	if a := do(t, req{method: "GET", url: ts.URL + "/orders"}); a.status != http.StatusOK {
		t.Fatalf("GET without a key: %s", a)
	}
}

// TestOrdersHandlerDelay: while a request sleeps in its handler
// (--handler-delay), a retry gets 409 and the same key with another body
// 422; when the first request is abandoned, its transaction rolls back, the
// key is released, and a retry creates the order. On every database: the
// delay comes before the handler's first statement, so even on SQLite its
// transaction holds no lock yet.
func TestOrdersHandlerDelay(t *testing.T) {
	for _, kind := range dbKinds {
		t.Run(kind.name, func(t *testing.T) {
			db := kind.fresh(t)
			// A delay far longer than the test: the first request only
			// ends when the test cancels it.
			s, slow := startServer(t, ServeOpts{DB: db, HandlerDelay: time.Hour})
			_, fast := startServer(t, ServeOpts{DB: db})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				hr, _ := req{method: "POST", url: slow.URL + "/orders", body: goodOrder, key: "slow-key"}.build(ctx)
				if resp, err := http.DefaultClient.Do(hr); err == nil {
					resp.Body.Close()
					t.Errorf("the slow request answered %d; it should only end by cancellation", resp.StatusCode)
				}
			}()
			waitRecord(t, s, "slow-key", func(rec *idem.Record, err error) bool { return err == nil && rec.State == idem.StateInFlight })

			retry := do(t, req{method: "POST", url: fast.URL + "/orders", body: goodOrder, key: "slow-key"})
			checkProblem(t, retry, http.StatusConflict, "in-flight")
			if retry.header.Get("Retry-After") == "" {
				t.Fatal("409 without Retry-After")
			}
			other := do(t, req{method: "POST", url: fast.URL + "/orders", body: `{"cart_id":"c_42","total_cents":1}`, key: "slow-key"})
			checkProblem(t, other, http.StatusUnprocessableEntity, "fingerprint-mismatch")

			cancel()
			wg.Wait()
			waitRecord(t, s, "slow-key", func(_ *idem.Record, err error) bool { return errors.Is(err, idem.ErrNotFound) })
			if n, _ := s.app.repo.count(context.Background(), DefaultTenant, "c_42"); n != 0 {
				t.Fatalf("%d orders after the abandoned request, want 0", n)
			}
			again := do(t, req{method: "POST", url: fast.URL + "/orders", body: goodOrder, key: "slow-key"})
			if again.status != http.StatusCreated || again.replayed() {
				t.Fatalf("retry after the release: %s, want a fresh 201", again)
			}
		})
	}
}

// waitRecord polls the record of key (default tenant) until ok says so.
// It bounds the wait by a count of polls, not by asserting a duration.
func waitRecord(t *testing.T, s *server, key string, ok func(*idem.Record, error) bool) {
	t.Helper()
	var rec *idem.Record
	var err error
	for range 1000 {
		rec, err = s.store.Get(context.Background(), DefaultTenant, key)
		if ok(rec, err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("record %q never reached the expected state: %+v, %v", key, rec, err)
}

func TestParseBearer(t *testing.T) {
	for _, c := range []struct {
		in     []string
		tenant string
		ok     bool
	}{
		{nil, DefaultTenant, true},
		{[]string{"Bearer alice"}, "alice", true},
		{[]string{"bearer alice"}, "alice", true},
		{[]string{"Bearer YWxpY2U="}, "YWxpY2U=", true},
		{[]string{"Bearer a-b.c_d~e+f/g"}, "a-b.c_d~e+f/g", true},
		{[]string{"Bearer ==="}, "", false},
		{[]string{"Bearer a=b"}, "", false},
		{[]string{"Bearer  alice"}, "", false},
		{[]string{"Bearer alice "}, "", false},
		{[]string{"Token alice"}, "", false},
		{[]string{""}, "", false},
		{[]string{"Bearer a", "Bearer b"}, "", false},
	} {
		tenant, ok := parseBearer(c.in)
		if tenant != c.tenant || ok != c.ok {
			t.Errorf("parseBearer(%q) = %q, %v; want %q, %v", c.in, tenant, ok, c.tenant, c.ok)
		}
	}
}

func TestDecodeOrderKeepsValues(t *testing.T) {
	r, err := decodeOrder(strings.NewReader(fmt.Sprintf(`{"total_cents":%d,"cart_id":"ü ß"}`, int64(maxTotalCents))))
	if err != nil || *r.CartID != "ü ß" || *r.TotalCents != maxTotalCents {
		t.Fatalf("decodeOrder = %+v, %v", r, err)
	}
}
