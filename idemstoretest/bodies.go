package idemstoretest

import (
	"math/rand/v2"
	"testing"

	"github.com/idem-go/idem"
)

// bodies: what is stored comes back byte for byte.
func (s *suite) bodies(t *testing.T) {
	roundTrip := func(h *harness, key string, want idem.Result) {
		h.t.Helper()
		st := h.fx.Store
		p := h.params(key, fingerprint(key))
		h.mustWin(st, p)
		h.mustComplete(st, key, p.Token, want)
		for _, other := range h.stores() {
			rec := h.mustLose(other, h.params(key, p.Fingerprint))
			checkResult(h.t, "replay of "+key, rec.Result, want)
		}
		h.mustBeComplete(st, key, want)
	}

	s.parallel(t, "Large", func(h *harness) {
		body := make([]byte, 1<<20)
		r := rand.NewChaCha8([32]byte{1})
		_, _ = r.Read(body)
		roundTrip(h, "large", idem.Result{Status: 200, Header: map[string][]string{"Content-Type": {"application/octet-stream"}}, Body: body})
	})

	s.parallel(t, "Binary", func(h *harness) {
		// Every byte value, NUL and invalid UTF-8 included, both ways.
		body := make([]byte, 0, 512)
		for i := range 256 {
			body = append(body, byte(i))
		}
		for i := 255; i >= 0; i-- {
			body = append(body, byte(i))
		}
		roundTrip(h, "binary", idem.Result{Status: 200, Body: body})
	})

	s.parallel(t, "Empty", func(h *harness) {
		roundTrip(h, "nil-body", idem.Result{Status: 204, Body: nil})
		roundTrip(h, "empty-body", idem.Result{Status: 204, Body: []byte{}})
		roundTrip(h, "empty-header", idem.Result{Status: 204, Header: map[string][]string{}})
	})

	// What the caller passes to Complete, and what Claim and Get return,
	// share no memory with the store: a handler reusing its buffer, or a
	// replay edited before sending, must not change the stored result.
	s.parallel(t, "NoAliasing", func(h *harness) {
		st := h.fx.Store
		fp := fingerprint("a")
		p := h.params("order-1", fp)
		h.mustWin(st, p)
		res := idem.Result{Status: 201, Header: map[string][]string{"X-A": {"original"}}, Body: []byte("original")}
		h.mustComplete(st, "order-1", p.Token, res)
		want := idem.Result{Status: 201, Header: map[string][]string{"X-A": {"original"}}, Body: []byte("original")}

		fp[0] ^= 0xff
		res.Body[0] = 'X'
		res.Header["X-A"][0] = "changed"
		res.Header["X-B"] = []string{"added"}
		rec := h.mustBeComplete(st, "order-1", want)
		if !rec.SameFingerprint(fingerprint("a")) {
			h.t.Errorf("the stored fingerprint changed with the caller's slice")
		}

		lost := h.mustLose(st, h.params("order-1", fingerprint("a")))
		for _, r := range []*idem.Record{rec, lost} {
			r.Fingerprint[0] ^= 0xff
			r.Result.Body[0] = 'Y'
			r.Result.Header["X-A"][0] = "edited"
			r.Result.Header["X-C"] = []string{"added"}
		}
		rec = h.mustBeComplete(st, "order-1", want)
		if !rec.SameFingerprint(fingerprint("a")) {
			h.t.Errorf("the stored fingerprint changed with a returned record")
		}
		checkResult(h.t, "replay after a returned record was edited", h.mustLose(st, h.params("order-1", fingerprint("a"))).Result, want)
	})

	s.parallel(t, "UnicodeHeaders", func(h *harness) {
		roundTrip(h, "unicode", idem.Result{
			Status: 201,
			Header: map[string][]string{
				"Content-Type":        {"text/plain; charset=utf-8"},
				"Content-Disposition": {`attachment; filename="café.txt"; filename*=UTF-8''caf%C3%A9.txt`},
				"X-Greeting":          {"héllo wörld — 世界 🎉", "tab\tinside", ""},
				"X-Quote":             {`"quoted" \ back\slash`},
			},
			Body: []byte("naïve résumé 🎉"),
		})
	})
}
