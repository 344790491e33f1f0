package idemhttp_test

import (
	"bytes"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

func fp(method, target, body string, header http.Header, names ...string) []byte {
	r := httptest.NewRequest(method, target, nil)
	for k, v := range header {
		r.Header[k] = v
	}
	return idemhttp.Fingerprint(r, []byte(body), names)
}

func TestFingerprintSame(t *testing.T) {
	base := fp("POST", "/orders?a=1&b=2", "body", nil)
	if len(base) != 32 {
		t.Fatalf("fingerprint is %d bytes, want 32 (SHA-256)", len(base))
	}
	for name, other := range map[string][]byte{
		"again":                    fp("POST", "/orders?a=1&b=2", "body", nil),
		"query order":              fp("POST", "/orders?b=2&a=1", "body", nil),
		"query encoding":           fp("POST", "/orders?a=%31&b=2", "body", nil),
		"empty query parts":        fp("POST", "/orders?a=1&&b=2&", "body", nil),
		"unselected header":        fp("POST", "/orders?a=1&b=2", "body", http.Header{"X-Trace": {"1"}}),
		"host and scheme agnostic": fp("POST", "https://other.example/orders?a=1&b=2", "body", nil),
	} {
		if !bytes.Equal(base, other) {
			t.Errorf("%s: fingerprint differs", name)
		}
	}
}

func TestFingerprintDiffers(t *testing.T) {
	seen := map[string]string{}
	for name, f := range map[string][]byte{
		"base":                   fp("POST", "/orders?a=1", "body", nil),
		"method":                 fp("PATCH", "/orders?a=1", "body", nil),
		"path":                   fp("POST", "/order?a=1", "body", nil),
		"escaped slash":          fp("POST", "/a%2Fb", "", nil),
		"slash":                  fp("POST", "/a/b", "", nil),
		"query value":            fp("POST", "/orders?a=2", "body", nil),
		"repeated order":         fp("POST", "/orders?a=1&a=2", "body", nil),
		"repeated order swapped": fp("POST", "/orders?a=2&a=1", "body", nil),
		"body":                   fp("POST", "/orders?a=1", "bodx", nil),
		"body moved to query":    fp("POST", "/orders?a=1b", "ody", nil),
		"name/value split":       fp("POST", "/orders?ab=", "", nil),
		"name/value split 2":     fp("POST", "/orders?a=b", "", nil),
		"header absent":          fp("POST", "/orders?a=1", "body", nil, "X-V"),
		"header empty":           fp("POST", "/orders?a=1", "body", http.Header{"X-V": {""}}, "X-V"),
		"header value":           fp("POST", "/orders?a=1", "body", http.Header{"X-V": {"1"}}, "x-v"),
		"header two values":      fp("POST", "/orders?a=1", "body", http.Header{"X-V": {"1", "2"}}, "X-V"),
		"header joined":          fp("POST", "/orders?a=1", "body", http.Header{"X-V": {"12"}}, "X-V"),
		// Parts the handler's parser drops against the decoded text they
		// resemble, which it keeps (see putQuery).
		"undecodable value": fp("POST", "/orders?a=%zz", "", nil),
		"escaped percent":   fp("POST", "/orders?a=%25zz", "", nil),
		"undecodable name":  fp("POST", "/orders?%zz=1", "", nil),
		"escaped name":      fp("POST", "/orders?%25zz=1", "", nil),
		"raw semicolon":     fp("POST", "/orders?a=1;b=2", "", nil),
		"escaped semicolon": fp("POST", "/orders?a=1%3Bb=2", "", nil),
		"both undecodable":  fp("POST", "/orders?%zz=%zz", "", nil),
		"undecodable and ;": fp("POST", "/orders?a=%zz;", "", nil),
		"escaped both":      fp("POST", "/orders?%25zz=%25zz", "", nil),
	} {
		if prev, ok := seen[string(f)]; ok {
			t.Errorf("%s and %s share a fingerprint", name, prev)
		}
		seen[string(f)] = name
	}
}

// The fingerprints of ordinary requests are stored with their records:
// they must not change from one version to the next, or every retry of a
// key in flight across an upgrade would get 422. These were computed
// before the query marks of putQuery existed, and still hold.
func TestFingerprintStable(t *testing.T) {
	for target, want := range map[string]string{
		"/orders":                 "fd792f33cbabcf20b469769bd7a5855d42570bcdf80d6463cb982d452c5d6eb6",
		"/orders?a=1&b=2":         "add6cab19efc4e20012d30c3e7123c998f8904c4607b9881e8cf881ef0216bd1",
		"/orders?b=%41+c&a=1&a=2": "b0274b7db16fda2dd2d091d49d2605c0a2a4fe1cae61abc1722562bdb83e5264",
	} {
		got := hex.EncodeToString(fp("POST", target, `{"cart_id":"c_42"}`, http.Header{"X-V": {"1"}}, "X-V"))
		if got != want {
			t.Errorf("fingerprint of POST %s = %s, want %s as stored by earlier versions", target, got, want)
		}
	}
}

func FuzzFingerprint(f *testing.F) {
	f.Add("POST", "/orders", "a=1&b=2", []byte(`{"qty":1}`), "v1", "application/json")
	f.Add("PATCH", "/a%2Fb", "", []byte{}, "", "")
	f.Add("POST", "/", "a=1&a=2", []byte("x"), "a,b", " Text/Plain ; charset=utf-8")
	f.Add("POST", "/", "a=%zz;b&&c=%41", []byte("x"), "", ";")
	f.Fuzz(func(t *testing.T, method, path, query string, body []byte, hv, ct string) {
		r, err := http.NewRequest(method, "http://h", nil)
		if err != nil {
			t.Skip()
		}
		r.URL.Path = path
		r.URL.RawQuery = query
		r.Header.Set("X-V", hv)
		if ct != "" {
			r.Header["Content-Type"] = []string{ct}
		}
		names := []string{"X-V"}
		a := idemhttp.Fingerprint(r, body, names)
		if len(a) != 32 {
			t.Fatalf("fingerprint is %d bytes", len(a))
		}
		// Deterministic.
		if b := idemhttp.Fingerprint(r, body, names); !bytes.Equal(a, b) {
			t.Fatal("two fingerprints of one request differ")
		}
		// One byte more in the body, or moved from the body into the
		// header, changes it.
		if b := idemhttp.Fingerprint(r, append(append([]byte(nil), body...), 'x'), names); bytes.Equal(a, b) {
			t.Fatal("a longer body has the same fingerprint")
		}
		if len(body) > 0 {
			r2 := r.Clone(r.Context())
			r2.Header["X-V"] = []string{hv + string(body[:1])}
			if b := idemhttp.Fingerprint(r2, body[1:], names); bytes.Equal(a, b) {
				t.Fatal("moving a byte from the body to a header keeps the fingerprint")
			}
		}
		// The method always counts.
		r3 := r.Clone(r.Context())
		r3.Method = method + "X"
		if b := idemhttp.Fingerprint(r3, body, names); bytes.Equal(a, b) {
			t.Fatal("another method has the same fingerprint")
		}
		// The media type counts; its case and parameters do not.
		if ct != "" {
			r4 := r.Clone(r.Context())
			r4.Header["Content-Type"] = []string{asciiUpper(ct) + "; q=1"}
			if b := idemhttp.Fingerprint(r4, body, names); !bytes.Equal(a, b) {
				t.Fatalf("Content-Type %q and %q differ", ct, r4.Header["Content-Type"][0])
			}
		}
		r5 := r.Clone(r.Context())
		r5.Header["Content-Type"] = []string{"x" + ct}
		if b := idemhttp.Fingerprint(r5, body, names); bytes.Equal(a, b) {
			t.Fatalf("Content-Type %q and %q share a fingerprint", ct, "x"+ct)
		}
	})
}

// asciiUpper upper-cases the ASCII letters of s only.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - ('a' - 'A')
		}
	}
	return string(b)
}

// manyParams returns a query of n parameters, in order or reversed.
func manyParams(n int, reversed bool) string {
	parts := make([]string, n)
	for i := range n {
		j := i
		if reversed {
			j = n - 1 - i
		}
		parts[i] = "p" + strconv.Itoa(j) + "=1"
	}
	return strings.Join(parts, "&")
}

// A query of more parameters than the handler's parser accepts is hashed
// as sent, without sorting a megabyte of parameters: two orders of it
// differ, while at the parser's limit the order still does not count.
func TestFingerprintQueryPastTheParserLimit(t *testing.T) {
	const limit = 10000
	if _, err := url.ParseQuery(manyParams(limit+1, false)); err == nil {
		t.Fatalf("url.ParseQuery accepts %d parameters: the limit moved", limit+1)
	}
	if a, b := fp("POST", "/o?"+manyParams(limit, false), "", nil), fp("POST", "/o?"+manyParams(limit, true), "", nil); !bytes.Equal(a, b) {
		t.Fatal("at the parser's limit, the order of the parameters counts")
	}
	if a, b := fp("POST", "/o?"+manyParams(limit+1, false), "", nil), fp("POST", "/o?"+manyParams(limit+1, true), "", nil); bytes.Equal(a, b) {
		t.Fatal("past the parser's limit, the query is not hashed as sent")
	}
}

// The media type counts, without its parameters or case; a request
// without Content-Type hashes as before media types counted.
func TestFingerprintMediaType(t *testing.T) {
	ct := func(v string) http.Header { return http.Header{"Content-Type": {v}} }
	json := fp("POST", "/o", "a=1", ct("application/json"))
	for _, same := range []string{"application/json; charset=utf-8", "APPLICATION/Json", "\tapplication/json ; x=y"} {
		if !bytes.Equal(json, fp("POST", "/o", "a=1", ct(same))) {
			t.Errorf("%q differs from application/json", same)
		}
	}
	for _, other := range []string{"application/x-www-form-urlencoded", "text/json", ""} {
		if bytes.Equal(json, fp("POST", "/o", "a=1", ct(other))) {
			t.Errorf("%q has the fingerprint of application/json", other)
		}
	}
	if bytes.Equal(json, fp("POST", "/o", "a=1", nil)) || bytes.Equal(fp("POST", "/o", "a=1", ct("")), fp("POST", "/o", "a=1", nil)) {
		t.Error("a request without Content-Type has the fingerprint of one with")
	}
}

// BenchmarkFingerprint measures the cost of a large query, against a body
// of the same size.
func BenchmarkFingerprint(b *testing.B) {
	mb := 1 << 20
	for _, bc := range []struct{ name, query, body string }{
		{"body=1MB", "", strings.Repeat("x", mb)},
		{"query=1MB/a=1&", strings.Repeat("a=1&", mb/4), ""},
		{"query=1MB/distinct", manyParams(mb/8, true)[:mb], ""},
		{"query=1MB/10000-params", manyParams(10000, true) + "&v=" + strings.Repeat("x", mb-len(manyParams(10000, true))), ""},
		{"query=1MB/one-param", "a=" + strings.Repeat("x", mb), ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			r := httptest.NewRequest("POST", "/x", nil)
			r.URL.RawQuery = bc.query
			body := []byte(bc.body)
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				idemhttp.Fingerprint(r, body, nil)
			}
		})
	}
}
