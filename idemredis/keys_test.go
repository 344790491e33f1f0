package idemredis

import (
	"strings"
	"testing"
)

func TestRecordKey(t *testing.T) {
	for _, c := range []struct{ tenant, key, want string }{
		{"", "k", "idem:{0::k}"},
		{"acme", "abc", "idem:{4:acme:abc}"},
		{"a:b", "c", "idem:{3:a:b:c}"},
		{"a", "b:c", "idem:{1:a:b:c}"},
		{"a}", "{k%", "idem:{4:a%7D:%7Bk%25}"},
	} {
		if got := recordKey("idem", c.tenant, c.key); got != c.want {
			t.Errorf("recordKey(%q, %q) = %q, want %q", c.tenant, c.key, got, c.want)
		}
	}
}

// TestRecordKeyHashTag: the Cluster hash tag (from the first '{' to the
// next '}') is the whole escaped identity, whatever braces the tenant or
// key hold, and distinct identities give distinct keys.
func TestRecordKeyHashTag(t *testing.T) {
	ids := [][2]string{{"a:b", "c"}, {"a", "b:c"}, {"a}", "b"}, {"a", "}b"}, {"{x}", "y"}, {"%7D", "y"}, {"}", "y"}, {"", ""}}
	seen := map[string][2]string{}
	for _, id := range ids {
		k := recordKey("p", id[0], id[1])
		if prev, dup := seen[k]; dup {
			t.Fatalf("%q and %q share key %q", prev, id, k)
		}
		seen[k] = id
		open := strings.IndexByte(k, '{')
		end := strings.IndexByte(k[open+1:], '}') + open + 1
		if end != len(k)-1 {
			t.Errorf("key %q for %q: hash tag ends at %d, not at the end", k, id, end)
		}
	}
}

// FuzzRecordKey: distinct identities never share a key, and the hash tag
// always spans the whole identity.
func FuzzRecordKey(f *testing.F) {
	f.Add("a:b", "c", "a", "b:c")
	f.Add("a}", "b", "a", "}b")
	f.Add("%7D", "x", "}", "x")
	f.Add("1:a", "b", "1", "a:b")
	f.Fuzz(func(t *testing.T, t1, k1, t2, k2 string) {
		a, b := recordKey("p", t1, k1), recordKey("p", t2, k2)
		if (t1 != t2 || k1 != k2) && a == b {
			t.Fatalf("(%q, %q) and (%q, %q) share key %q", t1, k1, t2, k2, a)
		}
		open := strings.IndexByte(a, '{')
		if end := strings.IndexByte(a[open+1:], '}') + open + 1; end != len(a)-1 {
			t.Fatalf("key %q: hash tag ends at %d, not at the end", a, end)
		}
	})
}
