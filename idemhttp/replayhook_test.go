package idemhttp_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// TestOnReplay: the hook runs for each replay and not for the first
// answer, sees the stored result, adds its own headers, and changes
// nothing the replay sets (status, body, stored headers, the key and
// replay fields, the framing); a panicking hook leaves the replay whole.
func TestOnReplay(t *testing.T) {
	e := newEnv(t, nil)
	var calls atomic.Int64
	var panicking atomic.Bool
	var seen idem.Result
	h := e.handler(t, idemhttp.Config{OnReplay: func(r *http.Request, res idem.Result, h http.Header) {
		calls.Add(1)
		seen = res
		if panicking.Load() {
			h.Set("X-Before-Panic", "1")
			panic("hook bug")
		}
		h.Set("x-replay-trace", "t-"+r.Header.Get("X-Trace"))
		h.Set("Content-Type", "text/evil")
		h.Set(idemhttp.HeaderReplayed, "false")
		h.Set(idemhttp.HeaderKey, "other")
		h.Set("Content-Length", "1")
		h.Set("X-Bad", "a\r\nInjected: 1")
	}}, &counting{})
	first := serve(h, request(http.MethodPost, "/orders", "k", "a"))
	if calls.Load() != 0 || first.Header().Get("X-Replay-Trace") != "" {
		t.Fatal("OnReplay ran for the first execution")
	}
	r := request(http.MethodPost, "/orders", "k", "a")
	r.Header.Set("X-Trace", "abc")
	w := serve(h, r)
	if calls.Load() != 1 {
		t.Fatalf("OnReplay ran %d times for one replay", calls.Load())
	}
	if seen.Status != http.StatusCreated || string(seen.Body) != first.Body.String() {
		t.Fatalf("OnReplay saw %d %q, want the stored %d %q", seen.Status, seen.Body, first.Code, first.Body)
	}
	hdr := w.Header()
	switch {
	case hdr.Get("X-Replay-Trace") != "t-abc":
		t.Fatalf("hook header %q, want t-abc", hdr.Get("X-Replay-Trace"))
	case hdr.Get("Content-Type") != "application/json":
		t.Fatalf("the hook replaced the stored Content-Type: %q", hdr.Get("Content-Type"))
	case hdr.Get(idemhttp.HeaderReplayed) != "true" || hdr.Get(idemhttp.HeaderKey) != "k":
		t.Fatalf("the hook changed the key or replay fields: %v", hdr)
	case hdr.Get("Content-Length") != "":
		t.Fatalf("the hook set Content-Length %q", hdr.Get("Content-Length"))
	case hdr.Get("X-Bad") != "a  Injected: 1":
		t.Fatalf("a hook value with CR LF sent as %q", hdr.Get("X-Bad"))
	case w.Code != first.Code || w.Body.String() != first.Body.String():
		t.Fatalf("replay %d %q, want %d %q", w.Code, w.Body, first.Code, first.Body)
	}

	panicking.Store(true)
	w = serve(h, request(http.MethodPost, "/orders", "k", "a"))
	if w.Code != first.Code || w.Body.String() != first.Body.String() || w.Header().Get("X-Before-Panic") != "" {
		t.Fatalf("replay after a hook panic: %d %q %v, want the replay without the hook's headers", w.Code, w.Body, w.Header())
	}
}

// TestOnReplayReplayFunc: in marker mode the hook runs before ReplayFunc
// rebuilds the answer.
func TestOnReplayReplayFunc(t *testing.T) {
	e := newEnv(t, nil)
	h := e.handler(t, idemhttp.Config{
		Mode: idem.ModeMarker,
		ReplayFunc: func(w http.ResponseWriter, r *http.Request, res idem.Result) {
			w.Header().Set("X-Seen-Hook", w.Header().Get("X-Hook"))
			w.WriteHeader(res.Status)
		},
		OnReplay: func(r *http.Request, res idem.Result, h http.Header) { h.Set("X-Hook", "1") },
	}, &counting{})
	serve(h, request(http.MethodPost, "/orders", "k", "a"))
	if w := serve(h, request(http.MethodPost, "/orders", "k", "a")); w.Header().Get("X-Seen-Hook") != "1" {
		t.Fatalf("ReplayFunc saw X-Hook %q, want the hook's 1", w.Header().Get("X-Seen-Hook"))
	}
}

// TestFirstExecution: true for the first execution of a key, false for
// the takeover of one whose lease ran out, and outside an execution.
func TestFirstExecution(t *testing.T) {
	e := newEnv(t, &idem.Config{Lease: 200 * time.Millisecond, Heartbeat: -1})
	var first [2]atomic.Bool
	var runs atomic.Int64
	started, release := make(chan struct{}), make(chan struct{})
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		if n <= 2 {
			first[n-1].Store(idemhttp.FirstExecution(r.Context()))
		}
		if n == 1 {
			close(started)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "ok")
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(h, request(http.MethodPost, "/orders", "k", "a")) }()
	<-started
	e.clock.Advance(300 * time.Millisecond)
	if w := serve(h, request(http.MethodPost, "/orders", "k", "a")); w.Code != http.StatusCreated {
		t.Fatalf("takeover: %d", w.Code)
	}
	close(release)
	<-done
	if !first[0].Load() || first[1].Load() {
		t.Fatalf("FirstExecution: first %v, takeover %v; want true, false", first[0].Load(), first[1].Load())
	}
	var passthrough atomic.Bool
	passthrough.Store(true)
	hp := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		passthrough.Store(idemhttp.FirstExecution(r.Context()))
	}))
	serve(hp, request(http.MethodPost, "/orders", "", "a"))
	if passthrough.Load() || idemhttp.FirstExecution(context.Background()) {
		t.Fatal("FirstExecution true outside an execution")
	}
}
