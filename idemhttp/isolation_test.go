package idemhttp_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// The tests in this file check that nothing a handler may still hold once
// its request has ended (its body, its ResponseWriter) is ever handed to
// another request. net/http makes a late read or write harmless; the
// middleware must too, whatever it reuses.

// A handler behind http.TimeoutHandler goes on running after the timeout
// answered: when it reads its body then, it must not read the body of the
// request another tenant is sending meanwhile.
func TestLateBodyReadBehindTimeoutHandler(t *testing.T) {
	e := newEnv(t, nil)
	proceed := make(chan struct{})
	lateRead := make(chan string, 1)
	globexStarted, globexRelease := make(chan struct{}), make(chan struct{})
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer globex" {
			close(globexStarted)
			<-globexRelease
			body, _ := io.ReadAll(r.Body)
			w.WriteHeader(http.StatusCreated)
			w.Write(body)
			return
		}
		// acme's handler, still running once the timeout has answered.
		<-proceed
		body, err := io.ReadAll(r.Body)
		lateRead <- string(body) + " / " + errString(err)
	})
	// The standard library's timeout, inside the middleware: no handler
	// bug at all.
	h := e.handler(t, idemhttp.Config{}, http.TimeoutHandler(inner, time.Millisecond, "timeout"))

	w := serve(h, as("acme", request(http.MethodPost, "/orders", "k1", "acme-card-4242")))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("acme: %d %q, want the timeout's 503", w.Code, w.Body)
	}
	globex := make(chan *httptest.ResponseRecorder)
	go func() {
		globex <- serve(h, as("globex", request(http.MethodPost, "/orders", "k2", "globex-card-1881")))
	}()
	<-globexStarted // globex's body is read and held, in whatever buffer it got
	close(proceed)
	got := <-lateRead
	close(globexRelease)
	wg := <-globex
	if strings.Contains(got, "globex") {
		t.Fatalf("acme's late read got globex's body: %q", got)
	}
	if !strings.HasSuffix(got, errString(http.ErrBodyReadAfterClose)) {
		t.Fatalf("acme's late read: %q, want http.ErrBodyReadAfterClose as net/http answers", got)
	}
	if wg.Code != http.StatusCreated || wg.Body.String() != "globex-card-1881" {
		t.Fatalf("globex: %d %q", wg.Code, wg.Body)
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

// A goroutine that writes after its handler returned (a common bug that
// net/http makes harmless) must not write into another request's answer,
// nor into what is stored and replayed for it.
func TestLateWriteGoesNowhere(t *testing.T) {
	const globexAnswer = "globex:order-2, 3 items, delivery on Monday"
	e := newEnv(t, nil)
	leaked := make(chan struct{})
	lateErr := make(chan error, 1)
	globexStarted, globexRelease := make(chan struct{}), make(chan struct{})
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer globex" {
			io.WriteString(w, globexAnswer)
			close(globexStarted)
			<-globexRelease
			return
		}
		go func() {
			<-leaked
			_, err := io.WriteString(w, "acme-secret")
			if err == nil {
				_, err = w.Write([]byte("acme-secret"))
			}
			lateErr <- err
		}()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "acme:order-1")
	}))
	if w := serve(h, as("acme", request(http.MethodPost, "/orders", "k1", "a"))); w.Body.String() != "acme:order-1" {
		t.Fatalf("acme: %d %q", w.Code, w.Body)
	}
	globex := make(chan *httptest.ResponseRecorder)
	go func() { globex <- serve(h, as("globex", request(http.MethodPost, "/orders", "k1", "a"))) }()
	<-globexStarted
	close(leaked)
	err := <-lateErr
	close(globexRelease)
	first := <-globex
	replay := serve(h, as("globex", request(http.MethodPost, "/orders", "k1", "a")))
	for name, w := range map[string]*httptest.ResponseRecorder{"answer": first, "replay": replay} {
		if w.Body.String() != globexAnswer {
			t.Errorf("globex's %s: %q, want %q", name, w.Body, globexAnswer)
		}
	}
	rec, gerr := e.store.Get(t.Context(), "globex", "k1")
	if gerr != nil || string(rec.Result.Body) != globexAnswer {
		t.Fatalf("globex's stored answer: %+v, %v", rec, gerr)
	}
	if !errors.Is(err, idemhttp.ErrHandlerReturned) {
		t.Fatalf("the late write returned %v, want ErrHandlerReturned", err)
	}
}

// A late call of Header, WriteHeader, Flush or a ResponseController
// method never panics, and reaches no other request.
func TestLateHeaderDoesNotPanic(t *testing.T) {
	e := newEnv(t, nil)
	proceed := make(chan struct{})
	done := make(chan error, 1)
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer globex" {
			w.WriteHeader(http.StatusCreated)
			return
		}
		go func() {
			<-proceed
			w.Header().Set("X-Late", "acme")
			w.WriteHeader(http.StatusTeapot)
			w.(http.Flusher).Flush()
			rc := http.NewResponseController(w)
			err := rc.SetWriteDeadline(time.Now())
			if u, ok := w.(interface{ Unwrap() http.ResponseWriter }); ok {
				u.Unwrap().Header().Set("X-Late", "acme")
			}
			done <- err
		}()
		w.WriteHeader(http.StatusCreated)
	}))
	serve(h, as("acme", request(http.MethodPost, "/orders", "k1", "a")))
	close(proceed)
	err := <-done
	if !errors.Is(err, http.ErrNotSupported) {
		t.Errorf("late SetWriteDeadline: %v, want http.ErrNotSupported", err)
	}
	w := serve(h, as("globex", request(http.MethodPost, "/orders", "k2", "a")))
	if w.Code != http.StatusCreated || w.Header().Get("X-Late") != "" {
		t.Fatalf("globex: %d %v", w.Code, w.Header())
	}
}
