package idemcheck_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
)

// chargeServer answers {"status":"charged"}, with no id: executions cannot
// be told apart by their bodies. It marks replays, and has the naive
// check-then-write race, so duplicates at one instant charge several
// times.
func chargeServer(t *testing.T) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var charges atomic.Int64
	var mu sync.Mutex
	done := map[string]bool{}
	race := newRaceWindow()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		seen := done[key]
		race.looked(key)
		mu.Unlock()
		if seen {
			w.Header().Set("Idempotent-Replayed", "true")
		} else {
			race.work(t, key)
			charges.Add(1)
			mu.Lock()
			done[key] = true
			mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"status":"charged"}`)
	}))
	t.Cleanup(srv.Close)
	return srv, &charges
}

// Identical unmarked answers from a server that marks its replays are
// several executions: check 1 fails, not warns.
func TestUnmarkedDuplicatesFromAMarkingServerFail(t *testing.T) {
	srv, charges := chargeServer(t)
	code, out, _ := run(t, srv.URL+"/charge")
	if charges.Load() < 3 {
		t.Fatalf("only %d charges: the race did not happen, the test proves nothing", charges.Load())
	}
	if l := line(t, out, "1"); code != idemcheck.ExitFail || !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "from a server that marks its replays") {
		t.Fatalf("exit %d, check 1: %s\n%s", code, l, out)
	}
}

// A find-or-create server gives the fresh key the first key's resource:
// check 4 fails even though the bodies differ. It is idempotent per key
// otherwise (one lock, replays marked), so checks 1 to 3 pass.
func TestSameLocationForAFreshKeyFails(t *testing.T) {
	var mu sync.Mutex
	answers := map[string]string{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		w.Header().Set("Location", "/orders/1")
		body, seen := answers[key]
		if seen {
			w.Header().Set("Idempotent-Replayed", "true")
		} else {
			body = fmt.Sprintf(`{"id":1,"found_for":%q}`, key)
			answers[key] = body
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	code, out, _ := run(t, srv.URL+"/orders")
	if l := line(t, out, "4"); code != idemcheck.ExitFail || !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, "same resource") {
		t.Fatalf("exit %d, check 4: %s\n%s", code, l, out)
	}
	if l := line(t, out, "1"); strings.HasPrefix(l, "FAIL") {
		t.Fatalf("check 1: %s", l)
	}
}

// A server that hangs on the duplicates is a failure of the checks (exit
// 1), not an unreachable address (exit 2).
func TestHangingServerFails(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	code, out, errOut := run(t, "--timeout", "300ms", "-n", "3", srv.URL+"/orders")
	if code != idemcheck.ExitFail || !strings.HasPrefix(line(t, out, "1"), "FAIL") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr: %s", code, out, errOut)
	}
}

// A server that ignores keys, checked without a body to vary and with
// answers that cannot be told apart: nothing is proven, so no exit 0.
func TestNothingProvenIsNotAPass(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(srv.Close)
	code, out, _ := run(t, srv.URL+"/jobs")
	if code != idemcheck.ExitFail || !strings.Contains(out, "NOT PROVEN: 0 passed") || !strings.Contains(out, "not proven:") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
}

// X-Total-Count, where the list is cut to a page, is the count.
func TestCountUsesXTotalCount(t *testing.T) {
	srv, o := protectedServer(t)
	paged := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Total-Count", strconv.Itoa(o.count()+1000))
		fmt.Fprint(w, `[]`) // an empty page: only the header counts
	}))
	t.Cleanup(paged.Close)
	code, out, _ := run(t, "-d", orderBody, "--count-url", paged.URL, srv.URL+"/orders")
	if l := line(t, out, "5"); code != idemcheck.ExitPass || !strings.HasPrefix(l, "PASS") || !strings.Contains(l, "1000 before") {
		t.Fatalf("exit %d, check 5: %s\n%s", code, l, out)
	}
}
