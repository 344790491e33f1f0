package idemhttp_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// A handler that declares a Content-Length and writes more is refused as
// net/http refuses it: the write that passes the declared length fails
// with http.ErrContentLength and is not recorded, so the first client and
// every replay get the declared bytes.
func TestContentLengthExcessRefused(t *testing.T) {
	e := newEnv(t, nil)
	var errs [3]error
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "5")
		w.WriteHeader(http.StatusCreated)
		_, errs[0] = io.WriteString(w, "hello")
		_, errs[1] = w.Write([]byte(" world"))
		_, errs[2] = io.Copy(w, strings.NewReader("!")) // through ReadFrom
	}))
	srv := newServer(t, h)
	for i, want := range []string{"", "true"} {
		code, body, replayed, err := post(srv, "k1", "a")
		if err != nil || code != http.StatusCreated || body != "hello" || replayed != want {
			t.Fatalf("answer %d: %d %q replayed=%q, %v; want 201 \"hello\"", i, code, body, replayed, err)
		}
	}
	if errs[0] != nil || !errors.Is(errs[1], http.ErrContentLength) || !errors.Is(errs[2], http.ErrContentLength) {
		t.Fatalf("writes returned %v, want nil then http.ErrContentLength twice", errs)
	}
	rec, err := e.store.Get(t.Context(), testTenant, "k1")
	if err != nil || string(rec.Result.Body) != "hello" {
		t.Fatalf("stored %+v, %v; want the declared 5 bytes", rec, err)
	}
}

// A handler that writes fewer bytes than it declared: net/http sends what
// it has and closes the connection, and the client sees a broken
// response. The middleware sends the same, stores nothing, and releases
// the key, so that the client's retry runs again.
func TestContentLengthShortNotStored(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "half")
			return
		}
		io.WriteString(w, "whole")
	}))
	srv := newServer(t, h)
	code, body, _, err := post(srv, "k1", "a")
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("first answer: %d %q, %v; want the broken response net/http sends (unexpected EOF)", code, body, err)
	}
	e.wantAbsent(t, testTenant, "k1")
	code, body, replayed, err := post(srv, "k1", "a")
	if err != nil || code != http.StatusOK || body != "whole" || replayed != "" || runs.Load() != 2 {
		t.Fatalf("retry: %d %q replayed=%q, %v, ran %d times; want a fresh run", code, body, replayed, err, runs.Load())
	}
}

// Statuses without a body refuse writes, as net/http does.
func TestNoBodyStatusRefusesWrites(t *testing.T) {
	e := newEnv(t, nil)
	var werr error
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
		_, werr = io.WriteString(w, "ignored")
	}))
	serve(h, request(http.MethodPost, "/orders", "k1", "a"))
	if !errors.Is(werr, http.ErrBodyNotAllowed) {
		t.Fatalf("Write after 204: %v, want http.ErrBodyNotAllowed", werr)
	}
	e.wantState(t, testTenant, "k1", idem.StateComplete)
	if rec, _ := e.store.Get(t.Context(), testTenant, "k1"); len(rec.Result.Body) != 0 {
		t.Fatalf("stored body %q for a 204", rec.Result.Body)
	}
}

// newServer serves h on a real connection, for what only a real server
// shows (a connection closed after a short body).
func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// post sends one keyed POST of testTenant and reads the whole answer.
func post(srv *httptest.Server, key, body string) (code int, respBody, replayed string, err error) {
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(body))
	as(testTenant, req)
	req.Header.Set(idemhttp.HeaderKey, key)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get(idemhttp.HeaderReplayed), err
}
