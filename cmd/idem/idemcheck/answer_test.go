package idemcheck

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// bodyServer answers every request with the body body(), counting the
// bytes it managed to write.
func bodyServer(t *testing.T, body func() io.Reader) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(w, body())
		written.Add(n)
	}))
	t.Cleanup(srv.Close)
	return srv, &written
}

func get(t *testing.T, c *checker) answer {
	t.Helper()
	c.Method = http.MethodGet
	return c.send(t.Context(), "k", nil)
}

// Of a body, the first 64 KiB are kept and 4 MiB read (hashed); a longer
// body is cut there and its connection closed, whatever the server sends.
func TestBodyIsReadWithinBounds(t *testing.T) {
	endless := func() io.Reader { return io.MultiReader(strings.NewReader("{"), zeros{}) }
	srv, written := bodyServer(t, endless)
	c, err := newChecker(Config{URL: srv.URL, Timeout: DefaultTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.closeIdle()
	a := get(t, c)
	if a.err != nil {
		t.Fatal(a.err)
	}
	if len(a.body) != maxKeptBody || a.size != maxReadBody || !a.cut {
		t.Fatalf("kept %d bytes, read %d, cut %v; want %d, %d, true", len(a.body), a.size, a.cut, maxKeptBody, maxReadBody)
	}
	srv.CloseClientConnections() // the server's write ends with the connection
	srv.Close()
	// What the server got out is what was read plus what the sockets
	// buffer, not the endless rest.
	if n := written.Load(); n > maxReadBody+64<<20 {
		t.Fatalf("the server wrote %d bytes", n)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Bodies past the kept part are still compared, by their hash.
func TestBodiesDifferingPastTheKeptPart(t *testing.T) {
	prefix := bytes.Repeat([]byte("a"), maxKeptBody+10)
	var n atomic.Int64
	srv, _ := bodyServer(t, func() io.Reader {
		return io.MultiReader(bytes.NewReader(prefix), strings.NewReader(fmt.Sprint(n.Add(1))))
	})
	c, err := newChecker(Config{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer c.closeIdle()
	a, b := get(t, c), get(t, c)
	if sameBody(&a, &b) || signature(&a) == signature(&b) {
		t.Fatal("bodies differing after the kept part compared equal")
	}
	if d := bodyDiff(&a, &b); !strings.Contains(d, fmt.Sprintf("the first %d bytes are identical", maxKeptBody)) {
		t.Fatalf("bodyDiff: %s", d)
	}
	a2 := a
	if !sameBody(&a, &a2) {
		t.Fatal("a body differs from itself")
	}
}

func TestCountList(t *testing.T) {
	big := "[" + strings.Repeat(`{"id":"ord_1","items":[1,2,{"x":[]}]},`, 19999) + `{"id":"last"}]`
	cases := []struct {
		in   string
		want int
		ok   bool
	}{
		{`[]`, 0, true},
		{`[1, "two", {"three": [3]}, [4], null]`, 5, true},
		{`{"object":"list","has_more":false,"data":[{"id":1},{"id":2}]}`, 2, true},
		{`{"meta":{"data":[1,2,3]},"data":[{}]}`, 1, true},
		{big, 20000, true},
		{`{"items":[]}`, 0, false},
		{`{"data":3}`, 0, false},
		{`"text"`, 0, false},
		{`[1, 2`, 0, false},
		{`<html>`, 0, false},
	}
	for _, c := range cases {
		got, err := countList(strings.NewReader(c.in))
		if got != c.want || (err == nil) != c.ok {
			t.Errorf("countList(%.40q) = %d, %v; want %d (ok %v)", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestPrintable(t *testing.T) {
	cases := map[string]string{
		"plain × ≤ … é 日本":  "plain × ≤ … é 日本",
		"\x1b[2J":           `\x1b[2J`,
		"a\rb\nc\td":        `a\x0db\x0ac\x09d`,
		"\u009b31m\u009d0;": `\u009b31m\u009d0;`,
		"\xc2\x9b":          `\u009b`,
		"\x9b\xff":          `\x9b\xff`,
		"\u202egnp\u2066":   `\u202egnp\u2066`,
		"\x00\x7f":          `\x00\x7f`,
	}
	for in, want := range cases {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestRedact(t *testing.T) {
	cases := map[string]string{
		"http://user:pw@host/x":                          "http://user:xxxxx@host/x",
		`Post "http://user:***@host:1/x": EOF`:           `Post "http://user:xxxxx@host:1/x": EOF`,
		"bad URL http://u:p@ss@host:port/x":              "bad URL http://u:xxxxx@host:port/x",
		"https://host/path?q=a:b@c":                      "https://host/path?q=a:b@c",
		"http://token@host/ and http://a:b@c/":           "http://token@host/ and http://a:xxxxx@c/",
		"redis://:pw@127.0.0.1:6379/0 postgres://u:p@db": "redis://:xxxxx@127.0.0.1:6379/0 postgres://u:xxxxx@db",
	}
	for in, want := range cases {
		if got := redactText(in); got != want {
			t.Errorf("redactText(%q) = %q, want %q", in, got, want)
		}
	}
}
