package console

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"html"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/safetext"
	"github.com/idem-go/idem/idemkeys"
)

// oddNames are tenants and keys that a path does not carry as they are:
// empty, dot segments (cleaned away by the mux and by browsers), slashes
// raw and escaped, the query and fragment marks, spaces and pluses, text
// beyond ASCII, and bytes that are not UTF-8.
var oddNames = []string{"", ".", "..", "/", "%2F", "a/../b", "?", "#", "?x=1#y", "a b+c", "ключ/漢字", "\xff\xfe"}

// href returns the URL that pattern's first group finds in page, as a
// browser reads it (its HTML entities decoded).
func href(t *testing.T, page, pattern string) string {
	t.Helper()
	m := regexp.MustCompile(pattern).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no %s on the page:\n%s", pattern, page)
	}
	return html.UnescapeString(m[1])
}

// asJSON is s as a JSON string carries it: each byte that is not UTF-8
// is U+FFFD.
func asJSON(s string) string {
	b, _ := json.Marshal(s)
	var back string
	_ = json.Unmarshal(b, &back)
	return back
}

// Every tenant and key, whatever it holds, round-trips through the
// console's URLs: the list links to the key's own page, the page shows
// its body and offers the action on it, the action acts on it and on no
// other, and the API reads it; the older path forms still serve a
// name a path can carry.
func TestOddNamesRoundTrip(t *testing.T) {
	srv, st, _ := newTestConsole(t)
	c, csrf := login(t, srv)
	ctx := context.Background()
	type name struct{ tenant, key string }
	var names []name
	for _, n := range oddNames {
		names = append(names, name{"tenant" + n, n}, name{n, "key"})
	}
	names = append(names, name{"", ""}, name{"..", ".."})
	for i, n := range names {
		claim(t, st, n.tenant, n.key, int64(i+1), "body of "+n.tenant+"|"+n.key)
	}
	for _, n := range names {
		t.Run(strings.ToValidUTF8(n.tenant+"|"+n.key, "�"), func(t *testing.T) {
			list := get(t, c, srv.URL+"/keys?"+url.Values{"tenant": {n.tenant}}.Encode(), http.StatusOK)
			link := ""
			for _, m := range regexp.MustCompile(`<td class="mono"><a href="([^"]*)">([^<]*)</a>`).FindAllStringSubmatch(list, -1) {
				// The list of tenant "" is that of every tenant: the row is
				// the one whose link names the tenant.
				u, err := url.Parse(html.UnescapeString(m[1]))
				if err == nil && html.UnescapeString(m[2]) == n.key && u.Query().Get("tenant") == n.tenant {
					link = u.String()
				}
			}
			if link == "" {
				t.Fatalf("the list does not show the key:\n%s", list)
			}
			page := get(t, c, srv.URL+link, http.StatusOK)
			body := get(t, c, srv.URL+href(t, page, `id="show-body" href="([^"]*)"`), http.StatusOK)
			want := "body of " + n.tenant + "|" + n.key
			if !utf8.ValidString(want) {
				want = hex.EncodeToString([]byte(want)) // shown as hex
			}
			if !strings.Contains(html.UnescapeString(body), want) {
				t.Fatalf("the key's page does not show its own body %q:\n%s", want, body)
			}

			var view keyView
			req, _ := http.NewRequest("GET", srv.URL+"/api/key?"+keyQuery(n.tenant, n.key), nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			err = json.NewDecoder(resp.Body).Decode(&view)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || view.Tenant != asJSON(n.tenant) || view.Key != asJSON(n.key) {
				t.Fatalf("GET /api/key: %d %+v, %v", resp.StatusCode, view, err)
			}

			confirm := get(t, c, srv.URL+href(t, page, `id="forget" href="([^"]*)"`), http.StatusOK)
			action := href(t, confirm, `<form method="post" action="(/key/[^"]*)"`)
			resp, err = c.PostForm(srv.URL+action, url.Values{"csrf": {csrf}, "reason": {"test"}, "confirm": {"yes"}})
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("forget through %s: %d", action, resp.StatusCode)
			}
			if _, err := st.Get(ctx, n.tenant, n.key); !errors.Is(err, idem.ErrNotFound) {
				t.Fatalf("the key is still there after its forget: %v", err)
			}
		})
	}
	// Each forget took its own key: one left per name is none left.
	if page, err := st.ListKeys(ctx, idemkeys.ListParams{Limit: 1000}); err != nil || len(page.Records) != 0 {
		t.Fatalf("left after forgetting every key: %d records, %v", len(page.Records), err)
	}

	// The path forms of before still serve a plain name.
	claim(t, st, "t", "k/1", 99, "old")
	get(t, c, srv.URL+"/keys/t/"+url.PathEscape("k/1"), http.StatusOK)
}

// A key holding a right-to-left override, an isolate and a zero-width
// space reads on the pages as what it holds (each invisible character
// written as an escape), and comes out of the API as the same string,
// the characters written as \u escapes.
func TestInvisibleCharactersShown(t *testing.T) {
	srv, st, _ := newTestConsole(t)
	const key = "order-\u202e24\u2066x\u2069\u200b"
	claim(t, st, "t\u202e", key, 1, "body")
	c, _ := login(t, srv)
	for _, path := range []string{"/keys", keyPath("t\u202e", key), "/"} {
		page := get(t, c, srv.URL+path, http.StatusOK)
		if strings.ContainsFunc(page, safetext.IsInvisible) {
			t.Errorf("%s shows an invisible character raw", path)
		}
	}
	page := get(t, c, srv.URL+keyPath("t\u202e", key), http.StatusOK)
	if !strings.Contains(page, `order-\u202e24\u2066x\u2069\u200b`) || !strings.Contains(page, `t\u202e`) {
		t.Errorf("the key's page does not show the key's escapes:\n%s", page)
	}
	req, _ := http.NewRequest("GET", srv.URL+"/api/key?"+keyQuery("t\u202e", key), nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var view keyView
	if err := json.Unmarshal(raw, &view); err != nil || view.Key != key || view.Tenant != "t\u202e" ||
		strings.ContainsFunc(string(raw), safetext.IsInvisible) || !strings.Contains(string(raw), `order-\u202e24`) {
		t.Errorf("GET /api/key: %v %+v\n%s", err, view, raw)
	}
}
