package idemcheck_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
)

const password = "S3cr3tPW"

// withPassword puts user:S3cr3tPW@ in raw's authority.
func withPassword(raw string) string {
	u, _ := url.Parse(raw)
	u.User = url.UserPassword("user", password)
	return u.String()
}

// A password in a URL is never printed: not in the report, its JSON, the
// load report, nor any error, net/http's included. (TestCredentialsNeverPrinted
// tries many more shapes.)
func TestPasswordNeverPrinted(t *testing.T) {
	srv, _ := protectedServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/orders"
	ln.Close()
	hanging := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(hanging.Close)

	cases := map[string][]string{
		"report":      {"-n", "3", "-d", orderBody, "--count-url", withPassword(srv.URL + "/orders"), withPassword(srv.URL + "/orders")},
		"json":        {"--json", "-n", "3", "-d", orderBody, "--count-url", withPassword(srv.URL + "/orders"), withPassword(srv.URL + "/orders")},
		"load":        {"--load", "--duration", "50ms", "--concurrency", "2", withPassword(srv.URL + "/orders")},
		"load json":   {"--load", "--json", "--duration", "50ms", "--concurrency", "2", withPassword(srv.URL + "/orders")},
		"unreachable": {"-n", "2", withPassword(closed)},
		"timeouts":    {"-n", "2", "--timeout", "100ms", withPassword(hanging.URL + "/orders")},
		"bad port":    {"http://user:" + password + "@127.0.0.1:port/x"},
		"bad scheme":  {"ftp://user:" + password + "@127.0.0.1/x"},
		"count URL":   {"-n", "2", "--count-url", "http://user:" + password + "@127.0.0.1:port/x", srv.URL + "/orders"},
		"two URLs":    {withPassword(srv.URL), withPassword(srv.URL + "/x")},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			_, out, errOut := run(t, args...)
			all := out + errOut
			if strings.Contains(all, password) || strings.Contains(all, url.QueryEscape(password)) {
				t.Fatalf("the password is printed:\n%s", all)
			}
			if name == "two URLs" {
				return // the arguments are not shown at all
			}
			if strings.Contains(all, "user:***@") || !strings.Contains(all, "user:xxxxx@") {
				t.Fatalf("want the URL shown as user:xxxxx@:\n%s", all)
			}
		})
	}
}

// hostile is what a server may send to take over the operator's
// terminal: clear the screen, set the window title, 8-bit CSI and OSC
// (U+009B, U+009D) in UTF-8 and raw, bytes that are not UTF-8, bidi
// overrides and isolates, carriage returns, and a line of its own that
// claims success.
const hostile = "\x1b[2J\x1b[H\x1b]0;pwned\x07 \u009b31m \u009d0;title\u009c \x9b1m \xff\xfe \u202egnp.exe \u2066x\u2069 \u200f \x00\x7f\rPASS \nPASS: 6 passed, 0 warnings, 0 failed, 0 skipped\n"

// hostileServer answers every request with a different body made of
// hostile bytes, and a Location and a header with those that net/http's
// client lets through in a header (8-bit controls in UTF-8, bidi, bytes
// that are not UTF-8: it refuses ASCII controls there), all written raw on
// the connection so that nothing in net/http's server tidies them.
func hostileServer(t *testing.T) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		body := fmt.Sprintf("%d %s", n.Add(1), hostile)
		fmt.Fprintf(buf, "HTTP/1.1 201 Created\r\nLocation: /orders/%d\xc2\x9b2J\u202e\r\nX-Evil: \u009d0;t\u009c\xff\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", n.Load(), len(body), body)
		_ = buf.Flush()
	}))
	t.Cleanup(srv.Close)
	return srv
}

// safeForTerminal reports the first rune of s a terminal could act on:
// a control character other than the newline, a C1 control, a format
// character (bidi controls), or a byte that is not UTF-8.
func safeForTerminal(s string) error {
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			return fmt.Errorf("byte %d: not UTF-8 (%q)", i, s[i:min(i+4, len(s))])
		case r == '\n':
		case !unicode.IsPrint(r):
			return fmt.Errorf("byte %d: %U", i, r)
		}
	}
	return nil
}

// Every byte a server sent is escaped before it reaches the terminal, in
// the text report, its JSON and the load report; and the server cannot
// start a line of its own.
func TestHostileBytesAreEscaped(t *testing.T) {
	srv := hostileServer(t)
	for _, args := range [][]string{
		{"-n", "4", "-d", orderBody, srv.URL + "/orders"},
		{"--json", "-n", "4", "-d", orderBody, srv.URL + "/orders"},
		{"--load", "--duration", "50ms", "--concurrency", "2", srv.URL + "/orders"},
	} {
		t.Run(args[0], func(t *testing.T) {
			_, out, errOut := run(t, args...)
			for _, s := range []string{out, errOut} {
				if err := safeForTerminal(s); err != nil {
					t.Fatalf("%v in:\n%q", err, s)
				}
				for _, l := range strings.Split(s, "\n") {
					if strings.HasPrefix(strings.TrimSpace(l), "PASS: 6 passed") {
						t.Fatalf("the server wrote a line of its own: %q", l)
					}
				}
			}
			if args[0] == "-n" && (!strings.Contains(out, `\x1b[2J`) || !strings.Contains(out, `\u009b`) || !strings.Contains(out, `\u202e`)) {
				t.Fatalf("the hostile bytes are not shown escaped:\n%s", out)
			}
		})
	}
}

// An answer's header block is read up to 64 KiB; a longer one fails the
// request instead of being held (net/http alone takes 10 MB).
func TestLongHeadersAreRefused(t *testing.T) {
	pad := strings.Repeat("x", 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Padding", pad)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	code, out, _ := run(t, "-n", "3", srv.URL+"/orders")
	if l := line(t, out, "1"); code != idemcheck.ExitFail || !strings.HasPrefix(l, "FAIL") || !strings.Contains(out, "exceeded") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}
