package idemhttp_test

import (
	"crypto/sha256"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// BenchmarkReplayCanonicalJSON is BenchmarkReplay under
// Config.IgnoreJSON: what the canonical form of a small JSON body and a
// left-out member cost on the replay path.
func BenchmarkReplayCanonicalJSON(b *testing.B) {
	e := newEnv(b, nil)
	h := e.handler(b, idemhttp.Config{IgnoreJSON: []string{"/customer"}}, benchHandler)
	r, body := benchRequest("replayed-key")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	b.ReportAllocs()
	defer reportCPU(b)()
	for b.Loop() {
		body.Reset(benchBody)
		w.Body.Reset()
		clear(w.Header())
		h.ServeHTTP(w, r)
	}
	if w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		b.Fatal("not a replay")
	}
}

// BenchmarkCanonicalJSONDeep is the worst case of the canonical form: a
// megabyte nested as deep as it goes (64 levels), every object's members
// out of order, so that each level copies what it holds. Compare with
// BenchmarkSHA256MiB, what hashing the same body as bytes costs.
func BenchmarkCanonicalJSONDeep(b *testing.B) {
	const levels = 63
	body := []byte(strings.Repeat(`{"b":1,"a":`, levels) + `"` + strings.Repeat("x", 1<<20) + `"` + strings.Repeat("}", levels))
	var dst []byte
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if dst, err = idemhttp.AppendCanonicalJSON(dst[:0], body, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSHA256MiB hashes a megabyte: the floor of fingerprinting one.
func BenchmarkSHA256MiB(b *testing.B) {
	body := []byte(strings.Repeat("x", 1<<20))
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		sha256.Sum256(body)
	}
}
