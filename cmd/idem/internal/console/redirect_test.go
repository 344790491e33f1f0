package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemmem"
)

// TestLoginRedirectStaysHere: a browser removes tabs and newlines from a
// URL before reading it, so a next of "/\t/evil.example" would send the
// operator to //evil.example once logged in; every control character
// and space is refused.
func TestLoginRedirectStaysHere(t *testing.T) {
	h, err := New(Config{Store: idemmem.NewStore(nil), Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	for _, next := range []string{"/\t/evil.example", "/\n/evil.example", "/\r/evil.example", "/\x0b/evil.example", "/ /evil.example", "/\x7f/evil.example"} {
		form := url.Values{"name": {"bob"}, "token": {testToken}, "next": {next}}
		req := httptest.NewRequest(http.MethodPost, "/login", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if loc := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || loc != "/" {
			t.Errorf("login with next %q redirects (%d) to %q, want / (303)", next, rec.Code, loc)
		}
	}
}
