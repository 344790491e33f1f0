package idemhttp_test

import (
	"net/http/httptest"
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
