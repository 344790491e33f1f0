package demo

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
)

// TestValidationAnswersAreNotStored: a 400, 413 or 415 under a key is sent
// but not stored, and the key is released, so that the client's corrected
// retry with the same key creates the order instead of replaying the
// refusal (or getting 422 for its corrected body). Duplicates of the bad
// request sent together are each refused afresh (or meet one of them in
// flight): none is a replay.
func TestValidationAnswersAreNotStored(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			s := start(t, kind.open(t), nil)
			url := s.url + "/orders"
			huge := `{"cart_id":"c_42","total_cents":1900,"pad":"` + strings.Repeat("x", maxOrderBody) + `"}`
			for i, bad := range []struct {
				name   string
				req    Req
				status int
				slug   string
			}{
				{"wrong Content-Type", Req{URL: url, Body: GoodOrder, ContentType: "text/plain"}, 415, "unsupported-media-type"},
				{"bad JSON", Req{URL: url, Body: `{"cart_id":"c_42",`}, 400, "invalid-order"},
				{"unknown field", Req{URL: url, Body: `{"cart_id":"c_42","total_cents":1900,"coupon":"X"}`}, 400, "invalid-order"},
				{"invalid UTF-8", Req{URL: url, Body: "{\"cart_id\":\"c\xff\",\"total_cents\":1900}"}, 400, "invalid-order"},
				{"query parameter", Req{URL: url + "?cart_id=c_42", Body: GoodOrder}, 400, "invalid-order"},
				{"too large", Req{URL: url, Body: huge}, 413, "order-too-large"},
			} {
				t.Run(bad.name, func(t *testing.T) {
					key := "bad-" + string(rune('a'+i))
					r := bad.req
					r.Method, r.Key = "POST", key
					dups := make([]Req, 8)
					for j := range dups {
						dups[j] = r
					}
					refused := 0
					for _, a := range FireTogether(dups) {
						switch {
						case a.Err != nil:
							t.Fatalf("duplicate: %v", a.Err)
						case a.Replayed():
							t.Fatalf("a refusal was replayed: %s", a)
						case a.Status == bad.status:
							refused++
							CheckProblem(t, a, bad.status, bad.slug)
						case a.Status == http.StatusConflict:
							// another duplicate was being refused
						case a.Status == http.StatusServiceUnavailable && strings.HasSuffix(problemType(a), "#store-unavailable"):
							// The SQL stores give up a claim, with a
							// store error, when the record vanishes three
							// times between their insert and their read:
							// here, each duplicate before it is refused
							// and released. A retry-later answer, never a
							// replay of the refusal.
							t.Logf("a duplicate answered 503 store-unavailable (the claim lost its record to releases three times): %s", a)
						default:
							t.Fatalf("duplicate answered %s, want %d or 409", a, bad.status)
						}
					}
					if refused == 0 {
						t.Fatalf("no duplicate was refused with %d", bad.status)
					}
					if rec, err := s.store.Get(context.Background(), DefaultTenant, key); !errors.Is(err, idem.ErrNotFound) {
						t.Fatalf("record after the refusal: %+v, %v; want none", rec, err)
					}
					// The same refusal again: refused afresh, not replayed.
					if a := Do(t, r); a.Status != bad.status || a.Replayed() {
						t.Fatalf("the refused request again: %s replayed=%v, want a fresh %d", a, a.Replayed(), bad.status)
					}
					fixed := Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, Key: key})
					if fixed.Status != http.StatusCreated || fixed.Replayed() {
						t.Fatalf("the corrected retry with the same key: %s replayed=%v, want a fresh 201", fixed, fixed.Replayed())
					}
					if again := Do(t, Req{Method: "POST", URL: url, Body: GoodOrder, Key: key}); !again.Replayed() || string(again.Body) != string(fixed.Body) {
						t.Fatalf("a retry of the corrected request: %s replayed=%v, want the 201 replayed", again, again.Replayed())
					}
				})
			}
			if n := s.count(t, DefaultTenant, "c_42"); n != 6 {
				t.Fatalf("%d orders, want 6: one per corrected key", n)
			}
		})
	}
}

func problemType(a Answer) string {
	var p Problem
	json.Unmarshal(a.Body, &p) //nolint:errcheck // an empty type for a body that is not one
	return p.Type
}

// TestRoutingAnswersAreNotStored: the idempotency layer sits behind the
// router, so the router's answers under a key (a redirect of an unclean
// path, 404, 405) store nothing, and the client that follows the redirect
// with the same key creates its order.
func TestRoutingAnswersAreNotStored(t *testing.T) {
	for _, kind := range kinds[:2] {
		t.Run(kind.name, func(t *testing.T) {
			s := start(t, kind.open(t), nil)
			noRecord := func(key string) {
				t.Helper()
				if rec, err := s.store.Get(context.Background(), DefaultTenant, key); !errors.Is(err, idem.ErrNotFound) {
					t.Fatalf("record for %q: %+v, %v; want none", key, rec, err)
				}
			}

			redirect := Do(t, Req{Method: "POST", URL: s.url + "//orders", Body: GoodOrder, Key: "redirected"})
			if redirect.Status != http.StatusTemporaryRedirect || redirect.Header.Get("Location") != "/orders" {
				t.Fatalf("POST //orders: %s Location %q, want 307 to /orders", redirect, redirect.Header.Get("Location"))
			}
			noRecord("redirected")
			created := Do(t, Req{Method: "POST", URL: s.url + redirect.Header.Get("Location"), Body: GoodOrder, Key: "redirected"})
			if created.Status != http.StatusCreated || created.Replayed() {
				t.Fatalf("the redirected POST with the same key: %s replayed=%v, want a fresh 201", created, created.Replayed())
			}
			// A client that follows redirects itself gets there too.
			followed := Send(http.DefaultClient, Req{Method: "POST", URL: s.url + "/./orders", Body: GoodOrder, Key: "followed"})
			if followed.Status != http.StatusCreated || followed.Replayed() {
				t.Fatalf("POST /./orders, redirect followed: %s, want a fresh 201", followed)
			}

			for _, c := range []struct {
				method, path string
				status       int
			}{
				{"PATCH", "/orders", http.StatusMethodNotAllowed},
				{"PATCH", "/orders/ord_1", http.StatusMethodNotAllowed},
				{"POST", "/orders/ord_1", http.StatusMethodNotAllowed},
				{"POST", "/nothing", http.StatusNotFound},
				{"POST", "/orders/", http.StatusNotFound},
			} {
				key := "routing-" + c.method + strings.ReplaceAll(c.path, "/", "-")
				a := Do(t, Req{Method: c.method, URL: s.url + c.path, Body: GoodOrder, Key: key})
				if a.Status != c.status {
					t.Fatalf("%s %s: %s, want %d", c.method, c.path, a, c.status)
				}
				noRecord(key)
			}
			if n := s.count(t, DefaultTenant, "c_42"); n != 2 {
				t.Fatalf("%d orders, want 2", n)
			}
		})
	}
}
