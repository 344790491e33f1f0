package demo

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"unicode"

	. "github.com/idem-go/idem/cmd/idem/internal/demo/demotest"
)

// TestStoredAsSent: the cart id stored and answered is exactly the one
// the client sent, or the order is refused. encoding/json would turn
// invalid UTF-8 and half surrogate pairs into U+FFFD and create an order
// for a cart the client never named.
func TestStoredAsSent(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			s := start(t, kind.open(t), nil)
			url := s.url + "/orders"
			for _, body := range []string{
				"{\"cart_id\":\"c\xff\",\"total_cents\":1900}",
				"{\"cart_id\":\"c\xed\xa0\x80\",\"total_cents\":1900}", // a surrogate, UTF-8 encoded
				"{\"cart_id\":\"c_42\",\"total_cents\":1900,\"n\xc3\":1}",
				"{\"cart_id\":\"c_42\",\"total_cents\":1900}\xff",
				`{"cart_id":"c\ud800","total_cents":1900}`,
				`{"cart_id":"c\udc00x","total_cents":1900}`,
				`{"cart_id":"c\ud800\u0041","total_cents":1900}`,
				`{"cart_id":"c\uD800\\udc00","total_cents":1900}`,
				`{"cart_id":"\ude00\ud83d","total_cents":1900}`,
			} {
				a := Do(t, Req{Method: "POST", URL: url, Body: body, Key: "k"})
				detail := CheckProblem(t, a, http.StatusBadRequest, "invalid-order")
				if !strings.Contains(detail, "UTF-8") && !strings.Contains(detail, "surrogate") {
					t.Errorf("body %q: detail %q does not say why", body, detail)
				}
			}
			if n := s.count(t, DefaultTenant, ""); n != 0 {
				t.Fatalf("%d orders after the refused bodies, want 0", n)
			}
			// Whole characters, escaped or not, U+FFFD itself included, are
			// stored as sent.
			for i, c := range []struct{ json, want string }{
				{`\ud83d\ude00`, "😀"},
				{`😀`, "😀"},
				{`\ufffd`, "\ufffd"},
				{"\xef\xbf\xbd", "\ufffd"},
				{`a\\ud800`, `a\ud800`}, // an escaped backslash: no escape at all
				{`\u00e9t\u00E9`, "été"},
			} {
				// A cart of its own for each.
				c.json, c.want = fmt.Sprint(i, c.json), fmt.Sprint(i, c.want)
				a := Do(t, Req{Method: "POST", URL: url, Body: `{"cart_id":"` + c.json + `","total_cents":1900}`, Key: fmt.Sprint("ok-", i)})
				if a.Status != http.StatusCreated || DecodeOrder(t, a).CartID != c.want {
					t.Fatalf("cart_id %s: %s, want 201 for %q", c.json, a, c.want)
				}
				got := ListOrders(t, s.url, urlQuery(c.want))
				if len(got) != 1 || got[0].CartID != c.want {
					t.Fatalf("cart_id %s: stored %+v, want %q", c.json, got, c.want)
				}
			}

			// The query of GET /orders: a parameter the decoder would
			// drop, repeat or ignore is refused, not answered for all carts.
			for _, q := range []string{"cart_id=c_42;x", "cart_id=%zz", "cart_id=a&cart_id=b", "cartid=c_42", "cart_id=%ff", "cart_id=c%C2%9B"} {
				CheckProblem(t, Do(t, Req{Method: "GET", URL: url + "?" + q}), http.StatusBadRequest, "invalid-order")
			}
		})
	}
}

func urlQuery(s string) string {
	r := strings.NewReplacer("%", "%25", "\\", "%5C", "&", "%26", "+", "%2B", "#", "%23")
	return r.Replace(s)
}

func TestLoneSurrogate(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want bool
	}{
		{`{"a":"\ud800"}`, true},
		{`{"a":"\udfff"}`, true},
		{`{"a":"\ud800\u0041"}`, true},
		{`{"a":"\ud800\ud800"}`, true},
		{`{"a":"\ud800x\udc00"}`, true},
		{`{"\ud800":1}`, true},
		{`{"a":"\ud83d\ude00"}`, false},
		{`{"a":"\\ud800"}`, false},
		{`{"a":"\\\ud800"}`, true},
		{`{"a":"\"\ud800"}`, true},
		{`{"a":"x"} "\ud800"`, true},
		{`{"a":1} \ud800`, false}, // outside a string: the decoder refuses it
		{`{"a":"\u00e9"}`, false},
		{`{"a":"\ud800`, true},
		{`{"a":"\ud8`, false},
		{`{"a":"\`, false},
	} {
		if got := loneSurrogate([]byte(c.raw)); got != c.want {
			t.Errorf("loneSurrogate(%s) = %v, want %v", c.raw, got, c.want)
		}
	}
}

func TestDecodeOrderKeepsValues(t *testing.T) {
	r, err := decodeOrder(strings.NewReader(fmt.Sprintf(`{"total_cents":%d,"cart_id":"ü ß"}`, int64(maxTotalCents))))
	if err != nil || *r.CartID != "ü ß" || *r.TotalCents != maxTotalCents {
		t.Fatalf("decodeOrder = %+v, %v", r, err)
	}
}

// TestErrorsQuoteLittle: an error quotes at most a few dozen bytes of what
// the client sent, escaped, so that the client cannot choose the size of
// an answer (or of a stored record, if one ever were) nor put control
// characters in it.
func TestErrorsQuoteLittle(t *testing.T) {
	s := start(t, sqliteBackend(t), nil)
	long := strings.Repeat("x", 10000)
	for _, c := range []struct {
		name string
		req  Req
	}{
		{"unknown field", Req{Method: "POST", URL: s.url + "/orders", Body: `{"` + long + `":1}`}},
		{"unknown field with controls", Req{Method: "POST", URL: s.url + "/orders", Body: `{"\u001b[2J\u009b2J\u0085` + long + `":1}`}},
		{"number literal", Req{Method: "POST", URL: s.url + "/orders", Body: `{"cart_id":"c","total_cents":1.` + strings.Repeat("0", 10000) + `}`}},
		{"path", Req{Method: "GET", URL: s.url + "/" + strings.Repeat("p", 10000) + "%1b%c2%9b"}},
		{"order id", Req{Method: "GET", URL: s.url + "/orders/" + strings.Repeat("i", 10000)}},
		{"method", Req{Method: strings.Repeat("M", 5000), URL: s.url + "/orders"}},
		{"query parameter", Req{Method: "GET", URL: s.url + "/orders?" + strings.Repeat("q", 10000) + "=1"}},
	} {
		a := Do(t, c.req)
		var p Problem
		if err := json.Unmarshal(a.Body, &p); err != nil || a.Status < 400 {
			t.Fatalf("%s: %s", c.name, a)
		}
		if len(p.Detail) > 250 || len(a.Body) > 600 {
			t.Errorf("%s: a %d-byte answer, detail %d bytes: %q", c.name, len(a.Body), len(p.Detail), p.Detail)
		}
		if c.name != "number literal" && !strings.Contains(p.Detail, " bytes)") {
			t.Errorf("%s: detail %q does not say how long the text it cut was", c.name, p.Detail)
		}
		if strings.IndexFunc(p.Detail, unicode.IsControl) >= 0 {
			t.Errorf("%s: detail holds a control character: %q", c.name, p.Detail)
		}
	}
	if n := s.count(t, DefaultTenant, ""); n != 0 {
		t.Fatalf("%d orders, want 0", n)
	}
}
