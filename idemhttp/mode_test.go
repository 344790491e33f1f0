package idemhttp_test

import (
	"io"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

func TestModeReference(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	var replayedRes idem.Result
	cfg := idemhttp.Config{
		Mode: idem.ModeReference,
		ReplayFunc: func(w http.ResponseWriter, r *http.Request, res idem.Result) {
			replayedRes = res
			w.Header().Set("Location", "/orders/"+res.Reference)
			w.WriteHeader(res.Status)
			io.WriteString(w, "order "+res.Reference+" (rebuilt)")
		},
	}
	h := e.handler(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		if r.URL.Path == "/fail" {
			http.Error(w, "out of stock", http.StatusConflict)
			return
		}
		idemhttp.SetReference(r.Context(), "ord_42")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order ord_42")
	}))
	first := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if first.Code != http.StatusCreated || first.Body.String() != "order ord_42" {
		t.Fatalf("first: %d %q", first.Code, first.Body)
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result.Mode != idem.ModeReference || rec.Result.Reference != "ord_42" || len(rec.Result.Body) != 0 {
		t.Fatalf("stored %+v, want the reference only", rec.Result)
	}
	w := serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if w.Code != http.StatusCreated || w.Body.String() != "order ord_42 (rebuilt)" || w.Header().Get(idemhttp.HeaderReplayed) != "true" || replayedRes.Reference != "ord_42" {
		t.Fatalf("replay: %d %q %v", w.Code, w.Body, w.Header())
	}
	wantEcho(t, w, "k1")

	// An error names no resource: stored whole and replayed as is.
	serve(h, request(http.MethodPost, "/fail", "k2", "a"))
	w = serve(h, request(http.MethodPost, "/fail", "k2", "a"))
	if w.Code != http.StatusConflict || w.Body.String() != "out of stock\n" || w.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("replayed error: %d %q", w.Code, w.Body)
	}
	if runs.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2", runs.Load())
	}
}

func TestModeMarker(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	cfg := idemhttp.Config{
		Mode: idem.ModeMarker,
		ReplayFunc: func(w http.ResponseWriter, r *http.Request, res idem.Result) {
			// Recomputed from the request, whose body reads again.
			body, _ := io.ReadAll(r.Body)
			w.WriteHeader(res.Status)
			io.WriteString(w, "recomputed from "+string(body))
		},
	}
	h := e.handler(t, cfg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "original")
	}))
	serve(h, request(http.MethodPost, "/jobs", "k1", "a"))
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Result.Mode != idem.ModeMarker || rec.Result.Status != http.StatusAccepted || len(rec.Result.Body) != 0 || len(rec.Fingerprint) == 0 {
		t.Fatalf("stored %+v with fingerprint %x, want a marker", rec.Result, rec.Fingerprint)
	}
	w := serve(h, request(http.MethodPost, "/jobs", "k1", "a"))
	if w.Code != http.StatusAccepted || w.Body.String() != "recomputed from a" || runs.Load() != 1 {
		t.Fatalf("replay %d %q, ran %d times", w.Code, w.Body, runs.Load())
	}
	wantProblem(t, serve(h, request(http.MethodPost, "/jobs", "k1", "b")), http.StatusUnprocessableEntity, "fingerprint-mismatch")
}

// A record stored by reference, replayed by a middleware configured
// without ReplayFunc (a configuration changed between deployments).
func TestReplayWithoutReplayFunc(t *testing.T) {
	e := newEnv(t, nil)
	ref := e.handler(t, idemhttp.Config{Mode: idem.ModeReference, ReplayFunc: func(http.ResponseWriter, *http.Request, idem.Result) {}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			idemhttp.SetReference(r.Context(), "ord_1")
			w.WriteHeader(http.StatusCreated)
		}))
	serve(ref, request(http.MethodPost, "/orders", "k1", "a"))
	plain := e.handler(t, idemhttp.Config{}, &counting{})
	w := serve(plain, request(http.MethodPost, "/orders", "k1", "a"))
	wantProblem(t, w, http.StatusInternalServerError, "replay-failed")
	wantEcho(t, w, "k1")
}
