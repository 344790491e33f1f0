package idemproxy_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemproxy"
)

// BenchmarkProxy measures the proxy's own cost per request, over the
// memory store, in front of an upstream on loopback that answers at
// once: fresh keys (forwarded, answer stored) and replays. The upstream's
// share is in every figure; compare them between revisions.
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":1,"status":"created"}`)) //nolint:errcheck // test
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	engine, err := idem.NewEngine(idemmem.NewStore(nil), &idem.Config{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	p, err := idemproxy.New(engine, &idemproxy.Config{Upstream: u,
		Middleware: idemhttp.Config{SharedKeySpace: true, Logger: quiet}})
	if err != nil {
		b.Fatal(err)
	}
	const body = `{"cart_id":"c_42","total_cents":1900}`
	send := func(b *testing.B, key string, replay bool) {
		req := httptest.NewRequest(http.MethodPost, "/orders", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		p.ServeHTTP(w, req)
		if w.Code != http.StatusCreated || (w.Header().Get("Idempotent-Replayed") == "true") != replay {
			b.Fatalf("status %d, replayed %q", w.Code, w.Header().Get("Idempotent-Replayed"))
		}
	}
	n := 0 // every key once, across -count runs too
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			n++
			send(b, "fresh-"+strconv.Itoa(n), false)
		}
	})
	b.Run("replay", func(b *testing.B) {
		n++
		key := "replay-" + strconv.Itoa(n)
		send(b, key, false)
		b.ReportAllocs()
		for b.Loop() {
			send(b, key, true)
		}
	})
}
