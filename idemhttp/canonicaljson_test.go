package idemhttp_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

func canon(t testing.TB, body string, ptrs *idemhttp.JSONPointers) ([]byte, error) {
	t.Helper()
	return idemhttp.AppendCanonicalJSON(nil, []byte(body), ptrs)
}

// TestCanonicalJSONSameAndDifferent: what the canonical form ignores and
// what it keeps.
func TestCanonicalJSONSameAndDifferent(t *testing.T) {
	ptrs, err := idemhttp.ParseJSONPointers("/ts", "/meta/nonce", "/items/1", "/a~1b", "/m~0n")
	if err != nil {
		t.Fatal(err)
	}
	same := [][2]string{
		{`{"a":1,"b":[true,false,null]}`, " {\n\t\"b\" : [ true , false , null ] , \"a\" : 1 }\r\n"},
		{`{"a":"x"}`, `{"\u0061":"\u0078"}`},
		{`{"s":"é😀/"}`, `{"s":"\u00e9\ud83d\ude00\/"}`},
		{`{"z":{"y":1,"x":2}}`, `{"z":{"x":2,"y":1}}`},
		{`{"a":1,"ts":"2026-01-01"}`, `{"ts":"2026-12-31T23:59:59Z","a":1}`},
		{`{"a":1,"ts":1}`, `{"a":1}`},
		{`{"meta":{"nonce":"n1","v":2}}`, `{"meta":{"v":2,"nonce":{"deep":[1]}}}`},
		{`{"items":[1,"rotating",3]}`, `{"items":[1,{"other":true},3]}`},
		{`{"a/b":1,"m~n":2,"k":3}`, `{"k":3}`},
	}
	for _, p := range same {
		a, errA := canon(t, p[0], ptrs)
		b, errB := canon(t, p[1], ptrs)
		if errA != nil || errB != nil || !bytes.Equal(a, b) {
			t.Errorf("%s and %s: canonical forms differ (%v, %v)", p[0], p[1], errA, errB)
		}
	}
	different := [][2]string{
		{`{"n":1}`, `{"n":1.0}`},
		{`{"n":100}`, `{"n":1e2}`},
		{`{"n":1e2}`, `{"n":1E2}`},
		{`{"n":-0}`, `{"n":0}`},
		{`[1,2]`, `[2,1]`},
		{`{"a":1,"a":2}`, `{"a":2,"a":1}`},
		{`"1"`, `1`},
		{`{"a":null}`, `{}`},
		{`[[]]`, `[[],[]]`},
		{`["a","b"]`, `["ab"]`},
		{`{"ab":"c"}`, `{"a":"bc"}`},
		{`{"items":[1,2,3]}`, `{"items":[1,3]}`},       // a left-out element still counts
		{`{"x":{"ts":1}}`, `{"x":{"ts":2}}`},           // only /ts is left out, not every ts
		{`{"s":"\ud800"}`, "{\"s\":\"\xed\xa0\x80\"}"}, // a lone surrogate is not its raw bytes
		{`{"s":"\ud800"}`, `{"s":"\ufffd"}`},
	}
	for _, p := range different {
		a, errA := canon(t, p[0], ptrs)
		b, errB := canon(t, p[1], ptrs)
		if errA != nil || errB != nil || bytes.Equal(a, b) {
			t.Errorf("%s and %s: same canonical form (%v, %v)", p[0], p[1], errA, errB)
		}
	}
	for _, bad := range []string{``, ` `, `{`, `{"a"}`, `{"a":1,}`, `[1,]`, `01`, `1.`, `.5`, `+1`, `1e`, `"\x01"`, `"\q"`, `"\u12"`, `tru`, `nul`, `{} {}`, `[1] x`, `{1:2}`, strings.Repeat("[", 2000) + strings.Repeat("]", 2000)} {
		if out, err := canon(t, bad, nil); !errors.Is(err, idemhttp.ErrNotJSON) {
			t.Errorf("%q: canonical form %q, %v; want ErrNotJSON", bad, out, err)
		}
	}
}

// TestParseJSONPointersRefused: pointers RFC 6901 does not allow, and the
// whole document, are refused, and so by NewMiddleware.
func TestParseJSONPointersRefused(t *testing.T) {
	for _, p := range []string{"", "ts", "/a~2", "/a~"} {
		if _, err := idemhttp.ParseJSONPointers(p); err == nil {
			t.Errorf("ParseJSONPointers(%q) accepted it", p)
		}
	}
	e := newEnv(t, nil)
	cfg := idemhttp.Config{TenantFunc: tenantOf, IgnoreJSON: []string{"ts"}}
	if _, err := idemhttp.NewMiddleware(e.engine, &cfg); err == nil {
		t.Fatal("NewMiddleware accepted a pointer without its /")
	}
	cfg = idemhttp.Config{TenantFunc: tenantOf, CanonicalJSON: true, FingerprintFunc: func(*http.Request, []byte) []byte { return nil }}
	if _, err := idemhttp.NewMiddleware(e.engine, &cfg); err == nil {
		t.Fatal("NewMiddleware accepted FingerprintFunc with CanonicalJSON")
	}
}

// TestCanonicalJSONMiddleware: under CanonicalJSON a retry whose JSON is
// laid out otherwise is replayed, one whose numbers are written otherwise
// is refused; without the option, the layout counts; IgnoreJSON lets a
// retry carry a new timestamp; a body that is not JSON is fingerprinted
// by its bytes.
func TestCanonicalJSONMiddleware(t *testing.T) {
	first := `{"cart":"c1","total":1200,"sent_at":"10:00"}`
	for _, tc := range []struct {
		name  string
		cfg   idemhttp.Config
		retry string
		want  int // 201 replayed, or 422
	}{
		{"bytes: reordered", idemhttp.Config{}, `{"total":1200,"cart":"c1","sent_at":"10:00"}`, http.StatusUnprocessableEntity},
		{"canonical: reordered", idemhttp.Config{CanonicalJSON: true}, "{ \"total\": 1200,\n \"sent_at\":\"10:00\", \"cart\": \"c1\" }", http.StatusCreated},
		{"canonical: 1200.0", idemhttp.Config{CanonicalJSON: true}, `{"cart":"c1","total":1200.0,"sent_at":"10:00"}`, http.StatusUnprocessableEntity},
		{"canonical: new timestamp", idemhttp.Config{CanonicalJSON: true}, `{"cart":"c1","total":1200,"sent_at":"10:01"}`, http.StatusUnprocessableEntity},
		{"ignored: new timestamp", idemhttp.Config{IgnoreJSON: []string{"/sent_at"}}, `{"sent_at":"10:01","cart":"c1","total":1200}`, http.StatusCreated},
		{"ignored: another cart", idemhttp.Config{IgnoreJSON: []string{"/sent_at"}}, `{"sent_at":"10:01","cart":"c2","total":1200}`, http.StatusUnprocessableEntity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			h := e.handler(t, tc.cfg, &counting{})
			if w := serve(h, request(http.MethodPost, "/orders", "k", first)); w.Code != http.StatusCreated {
				t.Fatalf("first: %d", w.Code)
			}
			w := serve(h, request(http.MethodPost, "/orders", "k", tc.retry))
			switch tc.want {
			case http.StatusCreated:
				if w.Code != http.StatusCreated || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
					t.Fatalf("retry: %d replayed=%q, want the replayed 201", w.Code, w.Header().Get(idemhttp.HeaderReplayed))
				}
			default:
				wantProblem(t, w, http.StatusUnprocessableEntity, "fingerprint-mismatch")
			}
		})
	}

	t.Run("not JSON", func(t *testing.T) {
		e := newEnv(t, nil)
		h := e.handler(t, idemhttp.Config{CanonicalJSON: true}, &counting{})
		serve(h, request(http.MethodPost, "/orders", "k", "{not json"))
		if w := serve(h, request(http.MethodPost, "/orders", "k", "{not json")); w.Header().Get(idemhttp.HeaderReplayed) != "true" {
			t.Fatalf("same bytes: %d, want a replay", w.Code)
		}
		wantProblem(t, serve(h, request(http.MethodPost, "/orders", "k", "{not  json")), http.StatusUnprocessableEntity, "fingerprint-mismatch")
	})
}

// TestFingerprintFunc: the function's answer is the fingerprint: here
// only the cart counts, so a retry with another total is replayed, one
// with another cart refused.
func TestFingerprintFunc(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{FingerprintFunc: func(r *http.Request, body []byte) []byte {
		var v struct{ Cart string }
		json.Unmarshal(body, &v)
		return []byte(r.URL.Path + "\x00" + v.Cart)
	}}, &counting{})
	serve(h, request(http.MethodPost, "/orders", "k", `{"cart":"c1","total":1}`))
	if w := serve(h, request(http.MethodPost, "/orders", "k", `{"cart":"c1","total":2}`)); w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("same cart: %d, want a replay", w.Code)
	}
	wantProblem(t, serve(h, request(http.MethodPost, "/orders", "k", `{"cart":"c2"}`)), http.StatusUnprocessableEntity, "fingerprint-mismatch")
}

// FuzzCanonicalJSON checks AppendCanonicalJSON against encoding/json: a
// body is canonical exactly when it is valid JSON (within the depth
// bound); its compact and indented layouts have its canonical form; and
// two bodies of one canonical form decode to the same value (numbers as
// written), so that the form never merges two requests a handler tells
// apart.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{`{"a":1,"b":[1,2,{"c":null}]}`, `{"b":2,"a":1}`, `[1.0,1e2,-0]`, `"\u00e9\ud800"`, `{"a":1,"a":2}`, `{}`, `[]`, `"x"`, `{"ts":"now"}`, ` {"ts" : 1 } `, `{"b":[1,2],"a":"` + strings.Repeat("long", 20) + `"}`} {
		f.Add([]byte(s), []byte(`{"a":1}`))
	}
	ptrs, err := idemhttp.ParseJSONPointers("/ts")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b []byte) {
		ca, errA := idemhttp.AppendCanonicalJSON(nil, a, nil)
		valid := json.Valid(a)
		if errA == nil && !valid {
			t.Fatalf("%q: canonical form of a body encoding/json refuses", a)
		}
		if errA != nil {
			if valid && bytes.Count(a, []byte("["))+bytes.Count(a, []byte("{")) <= 64 {
				t.Fatalf("%q: valid JSON refused: %v", a, errA)
			}
			return
		}
		var compact, indented bytes.Buffer
		if err := json.Compact(&compact, a); err != nil {
			t.Fatal(err)
		}
		if err := json.Indent(&indented, a, "", "  "); err != nil {
			t.Fatal(err)
		}
		for _, layout := range [][]byte{compact.Bytes(), indented.Bytes()} {
			if c, err := idemhttp.AppendCanonicalJSON(nil, layout, nil); err != nil || !bytes.Equal(c, ca) {
				t.Fatalf("%q laid out as %q: canonical form differs (%v)", a, layout, err)
			}
		}
		cb, errB := idemhttp.AppendCanonicalJSON(nil, b, nil)
		if errB == nil && bytes.Equal(ca, cb) && !bytes.Equal(a, b) {
			if va, vb := decodeNumbers(t, a), decodeNumbers(t, b); !reflect.DeepEqual(va, vb) {
				t.Fatalf("%q and %q: one canonical form, but they decode to %#v and %#v", a, b, va, vb)
			}
		}
		// Leaving a member out never makes a body invalid, and a body
		// without it is unchanged.
		if cp, err := idemhttp.AppendCanonicalJSON(nil, a, ptrs); err != nil {
			t.Fatalf("%q with /ts left out: %v", a, err)
		} else if !bytes.Contains(a, []byte("ts")) && !bytes.Contains(a, []byte(`\u`)) && !bytes.Equal(cp, ca) {
			t.Fatalf("%q holds no ts, yet leaving /ts out changed its form", a)
		}
	})
}

// decodeNumbers decodes a JSON body with its numbers as written.
func decodeNumbers(t *testing.T, body []byte) any {
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%q: %v", body, err)
	}
	return v
}

// jsonTree is a generated JSON value: an object (names), an array, or a
// scalar written as is.
type jsonTree struct {
	names []string
	kids  []*jsonTree
	array bool
	text  string
}

func genTree(r *rand.Rand, depth int) *jsonTree {
	switch k := r.IntN(6); {
	case depth == 0 || k < 2:
		return &jsonTree{text: []string{`1`, `1.0`, `"a"`, `"\u00e9"`, `null`, `true`, `-2e3`}[r.IntN(7)]}
	case k < 4:
		t := &jsonTree{}
		for i := range r.IntN(5) {
			t.names = append(t.names, string(rune('a'+i)))
			t.kids = append(t.kids, genTree(r, depth-1))
		}
		return t
	default:
		t := &jsonTree{array: true}
		for range r.IntN(4) {
			t.kids = append(t.kids, genTree(r, depth-1))
		}
		return t
	}
}

// write lays t out, its members shuffled by r when r is not nil.
func (t *jsonTree) write(b *strings.Builder, r *rand.Rand) {
	switch {
	case t.text != "":
		b.WriteString(t.text)
	case t.array:
		b.WriteByte('[')
		for i, k := range t.kids {
			if i > 0 {
				b.WriteString(" , ")
			}
			k.write(b, r)
		}
		b.WriteByte(']')
	default:
		order := make([]int, len(t.kids))
		for i := range order {
			order[i] = i
		}
		if r != nil {
			r.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		b.WriteByte('{')
		for n, i := range order {
			if n > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"` + t.names[i] + `":`)
			t.kids[i].write(b, r)
		}
		b.WriteByte('}')
	}
}

// TestCanonicalJSONShuffled: generated documents, nested up to the depth
// bound, have one canonical form whatever the order of their members at
// every level; one level more is not JSON to it.
func TestCanonicalJSONShuffled(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 500 {
		tree := genTree(r, 6)
		var a, b strings.Builder
		tree.write(&a, nil)
		tree.write(&b, r)
		ca, errA := canon(t, a.String(), nil)
		cb, errB := canon(t, b.String(), nil)
		if errA != nil || errB != nil || !bytes.Equal(ca, cb) {
			t.Fatalf("document %d: %s and %s differ (%v, %v)", i, a.String(), b.String(), errA, errB)
		}
	}
	deep := func(n int) string {
		return strings.Repeat(`{"b":1,"a":`, n) + `"x"` + strings.Repeat("}", n)
	}
	if _, err := canon(t, deep(64), nil); err != nil {
		t.Fatalf("64 levels: %v", err)
	}
	if _, err := canon(t, deep(65), nil); !errors.Is(err, idemhttp.ErrNotJSON) {
		t.Fatalf("65 levels: %v, want ErrNotJSON", err)
	}
}

// TestCanonicalJSONLongMembers: members whose names or values stand as
// their digest still order and compare as the members themselves.
func TestCanonicalJSONLongMembers(t *testing.T) {
	long := strings.Repeat("x", 100)
	pairs := []struct {
		a, b string
		same bool
	}{
		{`{"a":"` + long + `","b":1}`, `{"b":1,"a":"` + long + `"}`, true},
		{`{"` + long + `":[1,2],"a":{"z":"` + long + `","y":0}}`, `{"a":{"y":0,"z":"` + long + `"},"` + long + `":[1,2]}`, true},
		{`{"a":"` + long + `"}`, `{"a":"` + long[1:] + `y"}`, false},
		{`{"` + long + `":1}`, `{"` + long[1:] + `y":1}`, false},
		{`{"a":["` + long + `"]}`, `{"a":["` + long + `",1]}`, false},
	}
	for _, p := range pairs {
		a, errA := canon(t, p.a, nil)
		b, errB := canon(t, p.b, nil)
		if errA != nil || errB != nil || bytes.Equal(a, b) != p.same {
			t.Errorf("%.40s… and %.40s…: same form %v, want %v (%v, %v)", p.a, p.b, bytes.Equal(a, b), p.same, errA, errB)
		}
	}
}
