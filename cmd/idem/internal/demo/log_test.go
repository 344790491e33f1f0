package demo

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode"
)

// TestLogQuotesLittle: a request line of a megabyte makes a log line of
// a few hundred bytes, its path and query cut and escaped.
func TestLogQuotesLittle(t *testing.T) {
	logs := &syncBuffer{}
	h := logRequests(slog.New(slog.NewTextHandler(logs, nil)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
	}))
	const mb = 1 << 20
	for _, target := range []string{
		"/orders?cart_id=" + strings.Repeat("q", mb),
		"/" + strings.Repeat("p", mb) + "?x=" + strings.Repeat("q", mb),
		"/orders/%1b%5b2J%c2%9b?cart_id=%1b%c2%9d" + strings.Repeat("%1b", mb/3),
	} {
		r := httptest.NewRequest(http.MethodGet, target, nil)
		r.Header.Set("Idempotency-Key", strings.Repeat("k", mb))
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	r := httptest.NewRequest(http.MethodGet, "/orders", nil)
	r.Method = strings.Repeat("M", mb)
	h.ServeHTTP(httptest.NewRecorder(), r)

	lines := logs.lines("msg=request")
	if len(lines) != 4 {
		t.Fatalf("%d request lines, want 4:\n%s", len(lines), logs)
	}
	for _, l := range lines {
		if len(l) > 1500 {
			t.Errorf("a %d-byte log line: %.300s…", len(l), l)
		}
		if strings.IndexFunc(l, unicode.IsControl) >= 0 {
			t.Errorf("a log line holds a control character: %q", l)
		}
		if !strings.Contains(l, " bytes)") {
			t.Errorf("a cut log line does not say how long the text was: %.300s", l)
		}
	}
}

// TestLogKeepsShortValues: a request of ordinary size is logged whole.
func TestLogKeepsShortValues(t *testing.T) {
	logs := &syncBuffer{}
	h := logRequests(slog.New(slog.NewTextHandler(logs, nil)), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	key := strings.Repeat("k", 255)
	r := httptest.NewRequest(http.MethodPost, "/orders?cart_id=c_42", nil)
	r.Header.Set("Idempotency-Key", key)
	h.ServeHTTP(httptest.NewRecorder(), r)
	want := `method=POST path=/orders query="cart_id=c_42" status=200`
	if l := logs.String(); !strings.Contains(l, want) || !strings.Contains(l, "key="+key+"\n") {
		t.Fatalf("log %q, want %q and the whole key", l, want)
	}
}
