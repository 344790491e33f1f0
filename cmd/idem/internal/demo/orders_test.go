package demo

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/internal/testenv"
)

// TestOrdersOnEachDatabase runs the API's main paths on SQLite, PostgreSQL
// and MariaDB: the per-dialect schema and queries of the demo.
func TestOrdersOnEachDatabase(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			s := start(t, kind.open(t), nil)
			url := s.url + "/orders"

			// 20 duplicates at once: exactly one effect.
			reqs := make([]Req, 20)
			for i := range reqs {
				reqs[i] = Req{Method: "POST", URL: url, Body: GoodOrder, Key: "seed-key"}
			}
			first := CheckOneEffect(t, FireTogether(reqs))
			o := DecodeOrder(t, first)
			if o.CartID != "c_42" || o.TotalCents != 1900 || !strings.HasPrefix(o.ID, "ord_") || o.CreatedAt.IsZero() {
				t.Fatalf("created order %+v", o)
			}
			if loc := first.Header.Get("Location"); loc != "/orders/"+o.ID {
				t.Fatalf("Location %q, want /orders/%s", loc, o.ID)
			}

			// A second order in the same cart, another key.
			second := Do(t, Req{Method: "POST", URL: url, Body: `{"cart_id":"c_42","total_cents":500}`, Key: "other-key"})
			if second.Status != http.StatusCreated {
				t.Fatalf("second order: %s", second)
			}
			o2 := DecodeOrder(t, second)

			list := Do(t, Req{Method: "GET", URL: url + "?cart_id=c_42"})
			var got []Order
			if err := json.Unmarshal(list.Body, &got); err != nil || list.Status != http.StatusOK {
				t.Fatalf("list: %s (%v)", list, err)
			}
			if len(got) != 2 || !got[0].Same(o) && !got[1].Same(o) {
				t.Fatalf("list = %+v, want %+v and %+v", got, o, o2)
			}
			if total := list.Header.Get("X-Total-Count"); total != "2" {
				t.Fatalf("X-Total-Count %q, want 2", total)
			}
			// Text no database can hold, or no order id can be: refused
			// or not found, never a 500.
			CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "?cart_id=%ff"}), http.StatusBadRequest, "invalid-order")
			CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "?cart_id=a%00b"}), http.StatusBadRequest, "invalid-order")
			CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "/%ff"}), http.StatusNotFound, "order-not-found")
			CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "/a%00b"}), http.StatusNotFound, "order-not-found")
			if n := s.count(t, DefaultTenant, "c_42"); n != 2 {
				t.Fatalf("count = %d; want 2", n)
			}
			if other := Do(t, Req{Method: "GET", URL: url + "?cart_id=c_43"}); string(other.Body) != "[]\n" {
				t.Fatalf("empty cart: %s, want []", other)
			}

			one := Do(t, Req{Method: "GET", URL: url + "/" + o.ID})
			if one.Status != http.StatusOK || !DecodeOrder(t, one).Same(o) {
				t.Fatalf("GET /orders/%s = %s, want %+v", o.ID, one, o)
			}
			// The POST's answer and the GET's show the same instant.
			if string(one.Body) != string(first.Body) {
				t.Fatalf("GET body %q differs from the POST body %q", one.Body, first.Body)
			}
			CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "/ord_missing"}), http.StatusNotFound, "order-not-found")
		})
	}
}

func TestOrdersInvalidBody(t *testing.T) {
	s := start(t, sqliteBackend(t), nil)
	url := s.url + "/orders"
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
		{"total float", `{"cart_id":"c_42","total_cents":19.5}`, `"total_cents" must be an integer, not a JSON number`},
		{"total negative", `{"cart_id":"c_42","total_cents":-1}`, "negative"},
		{"total too large", `{"cart_id":"c_42","total_cents":9007199254740992}`, "larger than"},
		{"unknown field", `{"cart_id":"c_42","total_cents":1900,"coupon":"X"}`, `unknown field "coupon"`},
		{"two objects", GoodOrder + GoodOrder, "goes on after"},
		{"field in capitals", `{"CART_ID":"c_42","total_cents":1900}`, `unknown field "CART_ID"`},
		{"field twice", `{"cart_id":"c_1","cart_id":"c_42","total_cents":1900}`, `"cart_id" appears twice`},
		{"NUL in cart_id", `{"cart_id":"c\u0000_42","total_cents":1900}`, "control character"},
		{"newline in cart_id", `{"cart_id":"c\n42","total_cents":1900}`, "control character"},
		{"C1 in cart_id", `{"cart_id":"c\u009b42","total_cents":1900}`, "control character"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := Do(t, Req{Method: "POST", URL: url, Body: c.body, ContentType: "application/json"})
			if detail := CheckProblem(t, a, http.StatusBadRequest, "invalid-order"); !strings.Contains(detail, c.detail) {
				t.Errorf("detail %q does not say %q", detail, c.detail)
			}
		})
	}
	CheckProblem(t, Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, ContentType: "text/plain"}), http.StatusUnsupportedMediaType, "unsupported-media-type")
	huge := `{"cart_id":"c_42","total_cents":1900,"pad":"` + strings.Repeat("x", maxOrderBody) + `"}`
	CheckProblem(t, Do(t, Req{Method: "POST", URL: url, Body: huge}), http.StatusRequestEntityTooLarge, "order-too-large")
	CheckProblem(t, Do(t, Req{Method: "POST", URL: url + "?cart_id=c_42", Body: GoodOrder}), http.StatusBadRequest, "invalid-order")
	if a := Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, ContentType: "application/json; charset=utf-8"}); a.Status != http.StatusCreated {
		t.Fatalf("JSON with a charset: %s", a)
	}
	if n := s.count(t, DefaultTenant, "c_42"); n != 1 {
		t.Fatalf("%d orders after the refused bodies and one good one, want 1", n)
	}
}

func TestOrdersRouting(t *testing.T) {
	s := start(t, sqliteBackend(t), nil)
	a := Do(t, Req{Method: "DELETE", URL: s.url + "/orders"})
	CheckProblem(t, a, http.StatusMethodNotAllowed, "method-not-allowed")
	if allow := a.Header.Get("Allow"); !strings.Contains(allow, "POST") {
		t.Errorf("Allow %q", allow)
	}
	CheckProblem(t, Do(t, Req{Method: "PUT", URL: s.url + "/orders/ord_1", Body: GoodOrder}), http.StatusMethodNotAllowed, "method-not-allowed")
	CheckProblem(t, Do(t, Req{Method: "GET", URL: s.url + "/nothing"}), http.StatusNotFound, "not-found")
}

// TestOrdersMalformedAuthorization: a malformed Authorization is refused
// with 401 in front of the idempotency layer, so nothing is stored under
// the key and the same key works once the caller is authenticated.
func TestOrdersMalformedAuthorization(t *testing.T) {
	s := start(t, sqliteBackend(t), nil)
	url := s.url + "/orders"
	for _, auth := range []string{"Basic YWxpY2U6cHc=", "Bearer", "Bearer ", "Bearer a b", "Bearer al!ce", "bearer" + strings.Repeat("x", 200), "Bearer " + strings.Repeat("x", 129)} {
		a := Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, Key: "k-auth", Auth: auth})
		CheckProblem(t, a, http.StatusUnauthorized, "unauthenticated")
		if a.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("401 for %q without WWW-Authenticate", auth)
		}
	}
	// Two Authorization fields: which one is the caller?
	hr, _ := http.NewRequest("POST", url, strings.NewReader(GoodOrder))
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
	a := Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, Key: "k-auth", Auth: "Bearer alice"})
	if a.Status != http.StatusCreated || a.Replayed() {
		t.Fatalf("first authenticated request: %s replayed=%v, want a fresh 201", a, a.Replayed())
	}
	if n := s.count(t, "alice", "c_42"); n != 1 {
		t.Fatalf("alice has %d orders, want 1", n)
	}
}

// TestOrdersTenantScoping: one key under two tenants, sent at the same
// instant, is two operations; each tenant sees only its own order.
func TestOrdersTenantScoping(t *testing.T) {
	for _, kind := range kinds[:2] {
		t.Run(kind.name, func(t *testing.T) {
			s := start(t, kind.open(t), nil)
			url := s.url + "/orders"
			var reqs []Req
			for range 10 {
				reqs = append(reqs,
					Req{Method: "POST", URL: url, Body: GoodOrder, Key: "shared-key", Auth: "Bearer alice"},
					Req{Method: "POST", URL: url, Body: GoodOrder, Key: "shared-key", Auth: "Bearer bob"})
			}
			answers := FireTogether(reqs)
			var alice, bob []Answer
			for i, a := range answers {
				if i%2 == 0 {
					alice = append(alice, a)
				} else {
					bob = append(bob, a)
				}
			}
			aOrder := DecodeOrder(t, CheckOneEffect(t, alice))
			bOrder := DecodeOrder(t, CheckOneEffect(t, bob))
			if aOrder.ID == bOrder.ID {
				t.Fatalf("both tenants got order %s", aOrder.ID)
			}
			for tenant, want := range map[string]Order{"alice": aOrder, "bob": bOrder} {
				auth := "Bearer " + tenant
				replay := Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, Key: "shared-key", Auth: auth})
				if !replay.Replayed() || DecodeOrder(t, replay).ID != want.ID {
					t.Fatalf("%s's replay: %s, want its own order %s", tenant, replay, want.ID)
				}
				list := Do(t, Req{Method: "GET", URL: url + "?cart_id=c_42", Auth: auth})
				var got []Order
				if err := json.Unmarshal(list.Body, &got); err != nil || len(got) != 1 || got[0].ID != want.ID {
					t.Fatalf("%s's list: %s, want only %s", tenant, list, want.ID)
				}
				if n := s.count(t, tenant, "c_42"); n != 1 {
					t.Fatalf("%s has %d orders, want 1", tenant, n)
				}
			}
			CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "/" + bOrder.ID, Auth: "Bearer alice"}), http.StatusNotFound, "order-not-found")
			if n := s.count(t, DefaultTenant, "c_42"); n != 0 {
				t.Fatalf("the default tenant has %d orders, want 0", n)
			}
		})
	}
}

// TestOrdersRedisKeys: with the records in Redis and the orders in
// SQLite, duplicates sent together still make one order.
func TestOrdersRedisKeys(t *testing.T) {
	b := sqliteBackend(t)
	opts, err := redis.ParseURL(testenv.RedisURL(t))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	// The server is shared: the records of this test under a prefix of its
	// own.
	rs, err := idemredis.NewStore(rdb, &idemredis.Config{Prefix: testenv.Name()})
	if err != nil {
		t.Fatal(err)
	}
	b.store = rs
	s := start(t, b, nil)
	reqs := make([]Req, 20)
	for i := range reqs {
		reqs[i] = Req{Method: "POST", URL: s.url + "/orders", Body: GoodOrder, Key: "redis-key"}
	}
	CheckOneEffect(t, FireTogether(reqs))
	if n := s.count(t, DefaultTenant, "c_42"); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	if _, err := rs.Get(context.Background(), DefaultTenant, "redis-key"); err != nil {
		t.Fatalf("no record in Redis: %v", err)
	}
}

func TestOrdersRequireKey(t *testing.T) {
	s := start(t, sqliteBackend(t), func(c *Config) { c.RequireKey = true })
	CheckProblem(t, Do(t, Req{Method: "POST", URL: s.url + "/orders", Body: GoodOrder}), http.StatusBadRequest, "key-required")
	if a := Do(t, Req{Method: "POST", URL: s.url + "/orders", Body: GoodOrder, Key: "k1"}); a.Status != http.StatusCreated {
		t.Fatalf("with a key: %s", a)
	}
	// GETs are not covered by the layer: no key needed.
	if a := Do(t, Req{Method: "GET", URL: s.url + "/orders"}); a.Status != http.StatusOK {
		t.Fatalf("GET without a key: %s", a)
	}
}

// TestOrdersHandlerDelay: while a request sleeps in its handler
// (HandlerDelay), a retry gets 409 and the same key with another body 422.
// Its client going away does not end it: it runs on, so that the retry
// gets its answer, and retries still get 409. When the server stops at
// once (ShutdownContext), its transaction rolls back, the key is released,
// and a retry creates the order. On every database: the delay comes before
// the handler's first statement, so even on SQLite its transaction holds
// no lock yet.
func TestOrdersHandlerDelay(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			b := kind.open(t)
			// A delay far longer than the test: the first request only
			// ends when the test stops its server.
			slow := start(t, b, func(c *Config) { c.HandlerDelay = time.Hour })
			fast := start(t, b, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()

			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				hr, _ := Req{Method: "POST", URL: slow.url + "/orders", Body: GoodOrder, Key: "slow-key"}.Build(ctx)
				if resp, err := http.DefaultClient.Do(hr); err == nil {
					resp.Body.Close()
					t.Errorf("the slow request answered %d; its client should have gone first", resp.StatusCode)
				}
			}()
			slow.waitRecord(t, "slow-key", func(rec *idem.Record, err error) bool { return err == nil && rec.State == idem.StateInFlight })

			retry := Do(t, Req{Method: "POST", URL: fast.url + "/orders", Body: GoodOrder, Key: "slow-key"})
			CheckProblem(t, retry, http.StatusConflict, "in-flight")
			if retry.Header.Get("Retry-After") == "" {
				t.Fatal("409 without Retry-After")
			}
			other := Do(t, Req{Method: "POST", URL: fast.url + "/orders", Body: `{"cart_id":"c_42","total_cents":1}`, Key: "slow-key"})
			CheckProblem(t, other, http.StatusUnprocessableEntity, "fingerprint-mismatch")

			cancel() // the client goes away
			wg.Wait()
			CheckProblem(t, Do(t, Req{Method: "POST", URL: fast.url + "/orders", Body: GoodOrder, Key: "slow-key"}), http.StatusConflict, "in-flight")

			slow.stopHard()
			slow.waitRecord(t, "slow-key", func(_ *idem.Record, err error) bool { return errors.Is(err, idem.ErrNotFound) })
			if n := slow.count(t, DefaultTenant, "c_42"); n != 0 {
				t.Fatalf("%d orders after the stopped request, want 0", n)
			}
			again := Do(t, Req{Method: "POST", URL: fast.url + "/orders", Body: GoodOrder, Key: "slow-key"})
			if again.Status != http.StatusCreated || again.Replayed() {
				t.Fatalf("retry after the release: %s, want a fresh 201", again)
			}
		})
	}
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
