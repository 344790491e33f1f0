package idemcodec_test

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemcodec"
)

// FuzzUnmarshalHeader feeds arbitrary stored bytes to UnmarshalHeader, the
// decoder every store runs on a record's response headers before a replay
// sends them. A damaged or tampered row must never panic the server, and
// whatever the decoder accepts must be what MarshalHeader could have
// written: token names, each in one case only, values without control characters, and
// an encoding that round-trips to the same header and re-encodes to the
// same bytes.
//
// The seed corpus is in testdata/fuzz/FuzzUnmarshalHeader; to fuzz:
//
//	go test -run '^$' -fuzz '^FuzzUnmarshalHeader$' -fuzztime 60s ./idemcodec
func FuzzUnmarshalHeader(f *testing.F) {
	for _, seed := range []string{
		``,
		`null`,
		`{}`,
		`{"Content-Type":["application/json"]}`,
		`{"Location":["/orders/1"],"Content-Type":["application/json"]}`,
		`{"Content-Type": ["application/json"], "Location": ["/orders/1"]}`, // PostgreSQL jsonb spacing
		`{"Link":["<a>; rel=next","<b>; rel=prev"]}`,
		`{"X-Empty":[]}`,
		`{"X-Null":null}`,
		`{"X-Tab":["a\tb"]}`,
		`{"content-type":["text/plain"]}`,
		`{"Content-Type":["a"],"content-type":["b"]}`,
		`{"Set-Cookie":["a=1\r\nX-Injected: 1"]}`,
		`{"Bad Name":["x"]}`,
		`{"":["x"]}`,
		`{"X":["\u0000"]}`,
		`{"X":["\u007f"]}`,
		`{"X":["é"]}`,
		`{"X":"not a list"}`,
		`["X"]`,
		`{"X":["a"],"X":["b"]}`,
		"{\"X\":[\"\xff\"]}",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := idemcodec.UnmarshalHeader(b)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for name, values := range h {
			if name == "" || strings.ContainsAny(name, " \t\r\n:\"(),/;<=>?@[\\]{}") || strings.ContainsFunc(name, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
				t.Fatalf("accepted header name %q", name)
			}
			if lower := strings.ToLower(name); seen[lower] {
				t.Fatalf("accepted two spellings of header %q", name)
			} else {
				seen[lower] = true
			}
			for _, v := range values {
				if strings.ContainsFunc(v, func(r rune) bool { return (r < 0x20 && r != '\t') || r == 0x7f }) {
					t.Fatalf("accepted control character in %s: %q", name, v)
				}
			}
		}
		enc, err := idemcodec.MarshalHeader(h)
		if err != nil {
			t.Fatalf("accepted %q, but MarshalHeader refuses what it decoded to: %v", b, err)
		}
		h2, err := idemcodec.UnmarshalHeader(enc)
		if err != nil {
			t.Fatalf("MarshalHeader wrote %q, which UnmarshalHeader refuses: %v", enc, err)
		}
		if !maps.EqualFunc(h, h2, slices.Equal) {
			t.Fatalf("round trip changed the header: %q decoded to %q, re-decoded to %q", b, h, h2)
		}
		enc2, err := idemcodec.MarshalHeader(h2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding not stable: %q then %q (%v)", enc, enc2, err)
		}
	})
}
