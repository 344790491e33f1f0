package idemhttp_test

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// TestSameKeyAtTheSameInstant fires 50 identical requests released by one
// barrier: the handler runs exactly once, and every answer is the fresh
// 201, its byte-identical replay, or a 409 in flight.
func TestSameKeyAtTheSameInstant(t *testing.T) {
	const n = 50
	e := newEnv(t, nil)
	var runs atomic.Int64
	h := e.handler(t, idemhttp.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		// Long enough for the duplicates to meet the key in flight, yet
		// not asserted on: any interleaving must hold the invariants.
		time.Sleep(time.Millisecond)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/1")
		w.WriteHeader(http.StatusCreated)
		w.Write(append([]byte(`{"id":1,"echo":"`), append(body, `"}`...)...))
	}))

	barrier := make(chan struct{})
	answers := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := request(http.MethodPost, "/orders", "same-key", "buy 1")
			<-barrier
			answers[i] = serve(h, r)
		}()
	}
	close(barrier)
	wg.Wait()

	if got := runs.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want exactly 1", got)
	}
	want := []byte(`{"id":1,"echo":"buy 1"}`)
	var fresh, replayed, inFlight int
	for i, w := range answers {
		wantEcho(t, w, "same-key")
		switch {
		case w.Code == http.StatusCreated && w.Header().Get(idemhttp.HeaderReplayed) == "":
			fresh++
		case w.Code == http.StatusCreated && w.Header().Get(idemhttp.HeaderReplayed) == "true":
			replayed++
		case w.Code == http.StatusConflict:
			inFlight++
			wantProblem(t, w, http.StatusConflict, "in-flight")
			continue
		default:
			t.Fatalf("answer %d: %d %q", i, w.Code, w.Body)
		}
		if !bytes.Equal(w.Body.Bytes(), want) || w.Header().Get("Location") != "/orders/1" || w.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("answer %d: %q %v, want %q with its headers", i, w.Body, w.Header(), want)
		}
	}
	if fresh != 1 {
		t.Fatalf("%d fresh answers, want 1 (%d replayed, %d in flight)", fresh, replayed, inFlight)
	}
	t.Logf("1 fresh, %d replayed, %d in flight", replayed, inFlight)
}

// TestSameKeyTwoTenants: tenants own separate key spaces, so one key used
// by two tenants at the same instant runs twice, and each tenant replays
// its own answer.
func TestSameKeyTwoTenants(t *testing.T) {
	e := newEnv(t, nil)
	var runs atomic.Int64
	// The tenant comes from what authentication left in the request; here
	// a header stands for it.
	tenantOf := func(r *http.Request) (string, error) {
		if v := r.Header.Get("X-Test-Tenant"); v != "" {
			return v, nil
		}
		return "", errors.New("anonymous")
	}
	h := e.handler(t, idemhttp.Config{TenantFunc: tenantOf}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "order of "+r.Header.Get("X-Test-Tenant"))
	}))
	req := func(tenant string) *http.Request {
		r := request(http.MethodPost, "/orders", "shared-key", "same body")
		r.Header.Set("X-Test-Tenant", tenant)
		return r
	}

	const perTenant = 10
	barrier := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Value
	for _, tenant := range []string{"acme", "globex"} {
		for range perTenant {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := req(tenant)
				<-barrier
				w := serve(h, r)
				if w.Code == http.StatusCreated && w.Body.String() != "order of "+tenant {
					bad.Store(tenant + " got " + w.Body.String())
				}
			}()
		}
	}
	close(barrier)
	wg.Wait()
	if v := bad.Load(); v != nil {
		t.Fatal(v)
	}
	if got := runs.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2 (one per tenant)", got)
	}
	for _, tenant := range []string{"acme", "globex"} {
		w := serve(h, req(tenant))
		if w.Header().Get(idemhttp.HeaderReplayed) != "true" || w.Body.String() != "order of "+tenant {
			t.Fatalf("%s replays %q (replayed %q), want its own order", tenant, w.Body, w.Header().Get(idemhttp.HeaderReplayed))
		}
	}
}
