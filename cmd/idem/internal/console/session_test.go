package console

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemmem"
)

// testClock is a clock a test moves forward.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A session ends on the server: once older than SessionLifetime, the
// cookie that the browser still sends (or that was copied off it) opens
// no page and carries no action, and a new login opens them again. A
// cookie whose time of issue was changed, or that says it was issued in
// the future, is refused too.
func TestSessionExpiresOnTheServer(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)}
	st := idemmem.NewStore(nil)
	h, err := New(Config{Store: st, Token: testToken, SessionLifetime: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	h.now = clock.Now
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	claim(t, st, "t", "k", 4, "")

	c, csrf := login(t, srv)
	cookie := c.Jar.(*cookieJar).cookies[0]
	if cookie.MaxAge != 3600 {
		t.Errorf("the session cookie's Max-Age is %d, want the lifetime, 3600", cookie.MaxAge)
	}
	opens := func(cookie *http.Cookie) bool {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/keys", nil)
		req.AddCookie(cookie)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		switch {
		case resp.StatusCode == http.StatusOK:
			return true
		case resp.StatusCode == http.StatusSeeOther && strings.HasPrefix(resp.Header.Get("Location"), "/login"):
			return false
		}
		t.Fatalf("GET /keys: %d to %q", resp.StatusCode, resp.Header.Get("Location"))
		return false
	}
	release := func(cookie *http.Cookie) int {
		t.Helper()
		form := url.Values{"csrf": {csrf}, "reason": {"holder dead"}, "confirm": {"yes"}}
		req, _ := http.NewRequest("POST", srv.URL+actionPath("release", "t", "k"), strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(cookie)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	clock.Advance(59 * time.Minute)
	if !opens(cookie) {
		t.Fatal("a session 59 minutes old (lifetime 1h) is refused")
	}
	clock.Advance(time.Minute)
	if opens(cookie) {
		t.Error("a session as old as its lifetime still opens the pages")
	}
	if code := release(cookie); code != http.StatusUnauthorized {
		t.Errorf("release with an expired session: %d, want 401", code)
	}

	// Changing the time of issue breaks the HMAC; one forged in the
	// future is refused even with a valid HMAC (made here with the
	// token, which only the console holds).
	raw, _ := url.QueryUnescape(cookie.Value)
	issued, rest, _ := strings.Cut(raw, "|")
	sec, _ := strconv.ParseInt(issued, 10, 64)
	later := strconv.FormatInt(sec+3600, 10)
	if opens(&http.Cookie{Name: cookieName, Value: url.QueryEscape(later + "|" + rest)}) {
		t.Error("a cookie whose time of issue was moved forward opens the pages")
	}
	future := session{name: "bob", issued: strconv.FormatInt(clock.Now().Add(time.Hour).Unix(), 10)}
	if opens(&http.Cookie{Name: cookieName, Value: h.cookieValue(future)}) {
		t.Error("a session issued an hour in the future opens the pages")
	}
	// The format before sessions had a time: name|HMAC.
	if opens(&http.Cookie{Name: cookieName, Value: url.QueryEscape("bob|" + h.mac("session", "bob"))}) {
		t.Error("a cookie without a time of issue opens the pages")
	}

	// A new login opens them again, for another lifetime.
	c2, csrf2 := login(t, srv)
	if csrf2 == csrf {
		t.Error("a new login has the CSRF token of the session before")
	}
	if !opens(c2.Jar.(*cookieJar).cookies[0]) {
		t.Error("a new login does not open the pages")
	}
	if _, err := st.Get(t.Context(), "t", "k"); err != nil {
		t.Errorf("the expired session released the key: %v", err)
	}
}

// A name may hold the cookie's separator: it is the cookie's last part.
func TestSessionNameWithSeparator(t *testing.T) {
	h, err := New(Config{Store: idemmem.NewStore(nil), Token: testToken})
	if err != nil {
		t.Fatal(err)
	}
	want := session{name: "ops|night", issued: strconv.FormatInt(time.Now().Unix(), 10)}
	req := httptest.NewRequest("GET", "/", nil)
	req.AddCookie(&http.Cookie{Name: cookieName, Value: h.cookieValue(want)})
	if got, ok := h.session(req); !ok || got != want {
		t.Errorf("session = %+v, %v; want %+v", got, ok, want)
	}
}
