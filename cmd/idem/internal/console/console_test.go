package console

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

const testToken = "unit-test-token-0123456789"

func newTestConsole(t *testing.T) (*httptest.Server, *idemmem.Store, *strings.Builder) {
	t.Helper()
	st := idemmem.NewStore(nil)
	logs := &strings.Builder{}
	h, err := New(Config{Store: st, Token: testToken, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, st, logs
}

func claim(t *testing.T, st *idemmem.Store, tenant, key string, token int64, body string) {
	t.Helper()
	ctx := context.Background()
	if _, err := st.Claim(ctx, idem.ClaimParams{Tenant: tenant, Key: key, Token: token, Lease: time.Minute, Retention: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if body == "" {
		return
	}
	u, _ := st.Begin(ctx)
	if err := u.Complete(ctx, idem.CompleteParams{Tenant: tenant, Key: key, Token: token, Result: idem.Result{Status: 200, Body: []byte(body)}}); err != nil {
		t.Fatal(err)
	}
}

// client logs in and returns a client holding the session cookie, and
// the session's CSRF token read from a page.
func login(t *testing.T, srv *httptest.Server) (*http.Client, string) {
	t.Helper()
	jar := &cookieJar{}
	c := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.PostForm(srv.URL+"/login", url.Values{"name": {"bob"}, "token": {testToken}, "next": {"/keys"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/keys" {
		t.Fatalf("login: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	cookie := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(cookie, want) {
			t.Errorf("session cookie %q lacks %s", cookie, want)
		}
	}
	if strings.Contains(cookie, testToken) {
		t.Errorf("session cookie %q holds the token itself", cookie)
	}
	page := get(t, c, srv.URL+"/keys", http.StatusOK)
	_, rest, ok := strings.Cut(page, `name="csrf" value="`)
	if !ok {
		t.Fatal("no CSRF token on the page")
	}
	csrf, _, _ := strings.Cut(rest, `"`)
	return c, csrf
}

type cookieJar struct{ cookies []*http.Cookie }

func (j *cookieJar) SetCookies(_ *url.URL, cs []*http.Cookie) { j.cookies = append(j.cookies, cs...) }
func (j *cookieJar) Cookies(*url.URL) []*http.Cookie          { return j.cookies }

func get(t *testing.T, c *http.Client, u string, want int) string {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %d, want %d: %s", u, resp.StatusCode, want, b)
	}
	return string(b)
}

func TestEveryPageNeedsTheToken(t *testing.T) {
	srv, st, _ := newTestConsole(t)
	claim(t, st, "t", "k", 1, "")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, path := range []string{"/", "/keys", "/abandoned", "/key?tenant=t&key=k", "/key/release?tenant=t&key=k", "/keys/t/k", "/keys/t/k/release"} {
		resp, err := noRedirect.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/login") {
			t.Errorf("GET %s without a session: %d to %q, want the login form", path, resp.StatusCode, resp.Header.Get("Location"))
		}
	}
	for _, auth := range []string{"", "Bearer wrong", "Basic " + testToken, testToken} {
		req, _ := http.NewRequest("GET", srv.URL+"/api/keys", nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /api/keys with Authorization %q: %d, want 401", auth, resp.StatusCode)
		}
	}
	resp, err := http.PostForm(srv.URL+actionPath("release", "t", "k"), url.Values{"reason": {"x"}, "confirm": {"yes"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST release without a session: %d, want 401", resp.StatusCode)
	}
	if _, err := st.Get(context.Background(), "t", "k"); err != nil {
		t.Errorf("the key went away: %v", err)
	}
	resp, err = http.PostForm(srv.URL+"/login", url.Values{"name": {"eve"}, "token": {"guess"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("login with a wrong token: %d, cookie %q", resp.StatusCode, resp.Header.Get("Set-Cookie"))
	}
}

func TestMarkupIsEscaped(t *testing.T) {
	srv, st, _ := newTestConsole(t)
	tenant, key := `ten/<b>ant`, `<script>alert(1)</script>`
	claim(t, st, tenant, key, 5, `<script>alert("body")</script>`)
	c, _ := login(t, srv)
	list := get(t, c, srv.URL+"/keys", http.StatusOK)
	page := get(t, c, srv.URL+keyPath(tenant, key)+"&body=1", http.StatusOK)
	for name, html := range map[string]string{"list": list, "key page": page} {
		if strings.Contains(html, "<script>") || strings.Contains(html, "<b>") {
			t.Errorf("the %s holds the stored markup unescaped", name)
		}
		if !strings.Contains(html, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("the %s does not show the key as text", name)
		}
	}
	if !strings.Contains(page, `&lt;script&gt;alert(&#34;body&#34;)&lt;/script&gt;`) {
		t.Errorf("the key page does not show the body as text:\n%s", page)
	}
	if noBody := get(t, c, srv.URL+keyPath(tenant, key), http.StatusOK); strings.Contains(noBody, "alert(&#34;body") {
		t.Error("the key page shows the body without being asked")
	}
}

func TestActionsNeedCSRFAndAReason(t *testing.T) {
	srv, st, logs := newTestConsole(t)
	claim(t, st, "t", "k/1", 9, "")
	c, csrf := login(t, srv)
	post := func(form url.Values, origin string) int {
		req, _ := http.NewRequest("POST", srv.URL+actionPath("release", "t", "k/1"), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	form := url.Values{"reason": {"holder dead"}, "confirm": {"yes"}, "token": {"9"}}
	if code := post(form, ""); code != http.StatusForbidden {
		t.Errorf("release without the CSRF token: %d, want 403", code)
	}
	form.Set("csrf", csrf)
	if code := post(form, "http://evil.example"); code != http.StatusForbidden {
		t.Errorf("release from another origin: %d, want 403", code)
	}
	form.Set("reason", " ")
	if code := post(form, srv.URL); code != http.StatusBadRequest {
		t.Errorf("release without a reason: %d, want 400", code)
	}
	form.Set("token", "8")
	form.Set("reason", "holder dead")
	if code := post(form, srv.URL); code != http.StatusConflict {
		t.Errorf("release under another token: %d, want 409", code)
	}
	if _, err := st.Get(context.Background(), "t", "k/1"); err != nil {
		t.Fatalf("a refused release removed the key: %v", err)
	}
	form.Set("token", "9")
	if code := post(form, srv.URL); code != http.StatusOK {
		t.Fatalf("release: %d", code)
	}
	if _, err := st.Get(context.Background(), "t", "k/1"); err == nil {
		t.Error("the key is still there after its release")
	}
	if l := logs.String(); !strings.Contains(l, `reason="holder dead"`) || !strings.Contains(l, "who=\"bob (console") {
		t.Errorf("the release is not logged with its reason and operator:\n%s", l)
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{"/keys?x=1": "/keys?x=1", "//evil.example": "/", "https://evil.example": "/", "/\\evil": "/", "": "/"} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestReleaseRefusedWhenTheLeaseMoved: the holder extended its lease
// after the operator looked; the release is refused and offered again on
// the record as it is now, and goes through once confirmed again.
func TestReleaseRefusedWhenTheLeaseMoved(t *testing.T) {
	srv, st, _ := newTestConsole(t)
	claim(t, st, "t", "busy", 3, "")
	c, csrf := login(t, srv)
	rec, err := st.Get(context.Background(), "t", "busy")
	if err != nil {
		t.Fatal(err)
	}
	seen := rec.LockedUntil.UTC().Format(time.RFC3339Nano)
	// The heartbeat of a live holder.
	if err := st.Extend(context.Background(), idem.ExtendParams{Tenant: "t", Key: "busy", Token: 3, Lease: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	form := url.Values{"csrf": {csrf}, "reason": {"looks stuck"}, "confirm": {"yes"}, "token": {"3"}, "seen": {seen}}
	resp, err := c.PostForm(srv.URL+actionPath("release", "t", "busy"), form)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "its holder is alive") || !strings.Contains(string(body), "Release anyway") {
		t.Fatalf("release after the lease moved: %d\n%s", resp.StatusCode, body)
	}
	if _, err := st.Get(context.Background(), "t", "busy"); err != nil {
		t.Fatalf("the refused release removed the key: %v", err)
	}
	if !strings.Contains(string(body), "yes: a heartbeat moved it") {
		t.Errorf("the page does not say the lease was extended:\n%s", body)
	}
	form.Set("force", "1")
	resp, err = c.PostForm(srv.URL+actionPath("release", "t", "busy"), form)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("release confirmed again: %d", resp.StatusCode)
	}
	if _, err := st.Get(context.Background(), "t", "busy"); err == nil {
		t.Error("the key is still there after the release confirmed again")
	}
}
