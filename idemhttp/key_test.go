package idemhttp_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", idem.MaxKeyLength)
	for _, tc := range []struct {
		values []string // nil: no field
		want   string
		ok     bool
	}{
		{nil, "", true},
		{[]string{"abc"}, "abc", true},
		{[]string{`"abc"`}, "abc", true},
		{[]string{"  abc\t"}, "abc", true},
		{[]string{` "abc" `}, "abc", true},
		{[]string{`"a,b"`}, "a,b", true},
		{[]string{`"a\"b\\c"`}, `a"b\c`, true},
		{[]string{`a"b`}, `a"b`, true},
		{[]string{long}, long, true},
		{[]string{`"` + long + `"`}, long, true},
		{[]string{"6f1b5a1e-2f6c-4c8e-9c64-0c1f2b3a4d5e"}, "6f1b5a1e-2f6c-4c8e-9c64-0c1f2b3a4d5e", true},

		{[]string{""}, "", false},
		{[]string{`""`}, "", false},
		{[]string{long + "k"}, "", false},
		{[]string{"a b"}, "", false},
		{[]string{`"a b"`}, "", false}, // a space is valid in an sf-string but not in a key
		{[]string{"a,b"}, "", false},
		{[]string{"a, b"}, "", false},
		{[]string{`"a", "b"`}, "", false},
		{[]string{`"abc`}, "", false},
		{[]string{`"abc"x`}, "", false},
		{[]string{`"abc";p=1`}, "", false},
		{[]string{`"a\nb"`}, "", false},
		{[]string{`"a\`}, "", false},
		{[]string{"\"a\x7fb\""}, "", false},
		{[]string{"é"}, "", false},
		{[]string{"a", "b"}, "", false},
		{[]string{"a", "a"}, "", false},
		{[]string{}, "", false},
	} {
		h := http.Header{}
		if tc.values != nil {
			h[idemhttp.HeaderKey] = tc.values
		}
		got, err := idemhttp.ParseKey(h)
		if tc.ok {
			if err != nil || got != tc.want {
				t.Errorf("ParseKey(%q) = %q, %v; want %q", tc.values, got, err, tc.want)
			}
			continue
		}
		if err == nil {
			t.Errorf("ParseKey(%q) = %q, want an error", tc.values, got)
		} else if !errors.Is(err, idem.ErrInvalidKey) {
			t.Errorf("ParseKey(%q) error %v does not wrap idem.ErrInvalidKey", tc.values, err)
		}
	}
}

// quoteKey encodes key as an RFC 8941 sf-string.
func quoteKey(key string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	return `"` + r.Replace(key) + `"`
}

func FuzzParseKey(f *testing.F) {
	for _, seed := range []string{"abc", `"abc"`, `"a\"b"`, "a,b", `"a,b"`, "", `""`, " x ", `"x`, `"x";a`, "é", strings.Repeat("k", 256)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		key, err := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: {value}})
		if err != nil {
			if !errors.Is(err, idem.ErrInvalidKey) {
				t.Fatalf("error %v does not wrap idem.ErrInvalidKey", err)
			}
			return
		}
		// What parses is a valid key...
		if err := idem.ValidateKey(key); err != nil {
			t.Fatalf("ParseKey(%q) = %q, which ValidateKey refuses: %v", value, key, err)
		}
		// ...that its sf-string form names too...
		if again, err := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: {quoteKey(key)}}); err != nil || again != key {
			t.Fatalf("quoted %q parses to %q, %v; want %q", quoteKey(key), again, err, key)
		}
		// ...and so does its bare form, unless a comma or a leading quote
		// forbids it.
		if !strings.ContainsRune(key, ',') && key[0] != '"' {
			if again, err := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: {key}}); err != nil || again != key {
				t.Fatalf("bare %q parses to %q, %v", key, again, err)
			}
		}
		// Two fields are never one key.
		if _, err := idemhttp.ParseKey(http.Header{idemhttp.HeaderKey: {value, value}}); err == nil {
			t.Fatal("two fields accepted")
		}
	})
}
