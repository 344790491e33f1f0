package idemcheck_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/idem-go/idem/cmd/idem/idemcheck"
)

// firstAnswerServer runs every request, duplicates included (each creates
// an order), and answers every duplicate with the key's first answer,
// marked as a replay; a key reused with another body gets 422. From its
// answers alone it is a perfect idempotent endpoint; only a count shows
// that it ran 20 times.
func firstAnswerServer(t *testing.T) (*httptest.Server, *orders) {
	t.Helper()
	o := &orders{}
	var mu sync.Mutex
	first := map[string]*httptest.ResponseRecorder{}
	bodies := map[string]string{}
	post := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		mu.Lock()
		if b, seen := bodies[key]; seen && b != string(body) {
			mu.Unlock()
			w.WriteHeader(http.StatusUnprocessableEntity)
			return
		}
		bodies[key] = string(body)
		rec := httptest.NewRecorder()
		o.create(rec, r) // every request runs
		stored, replay := first[key]
		if !replay {
			first[key], stored = rec, rec
		}
		mu.Unlock()
		for k, v := range stored.Header() {
			w.Header()[k] = v
		}
		if replay {
			w.Header().Set("Idempotent-Replayed", "true")
		}
		w.WriteHeader(stored.Code)
		_, _ = w.Write(stored.Body.Bytes())
	})
	srv := httptest.NewServer(o.mux(post))
	t.Cleanup(srv.Close)
	return srv, o
}

// Without --count-url nothing observed that duplicates ran once: no PASS
// for check 1, no exit 0, a warning that names --count-url, and a summary
// that says what was proven and what was not.
func TestUncountedDuplicatesAreNotProven(t *testing.T) {
	srv, o := firstAnswerServer(t)
	code, out, errOut := run(t, "-d", orderBody, srv.URL+"/orders")
	t.Logf("report:\n%s%s", out, errOut)
	if o.count() < 20 {
		t.Fatalf("the server created %d orders for check 1's 20 requests: it did not run every duplicate, the test proves nothing", o.count())
	}
	if code == idemcheck.ExitPass {
		t.Fatalf("exit 0 after %d orders for one key, with nothing counted", o.count())
	}
	if l := line(t, out, "1"); strings.HasPrefix(l, "PASS") || !strings.Contains(l, "--count-url") {
		t.Errorf("check 1: %s; want no PASS, and --count-url named", l)
	}
	if !strings.Contains(errOut, "warning") || !strings.Contains(errOut, "--count-url") {
		t.Errorf("stderr %q: want a warning naming --count-url", errOut)
	}
	if strings.Contains(out, "\nPASS:") || !strings.Contains(out, "\nNOT PROVEN:") {
		t.Errorf("verdict: want NOT PROVEN, not PASS")
	}
	_, notProven, ok := strings.Cut(out, "not proven:\n")
	if !ok || !strings.Contains(notProven, "1. duplicates at one instant ran once") || !strings.Contains(out, "proven:\n  2. ") {
		t.Errorf("summary does not say what was proven (check 2) and what was not (check 1)")
	}
}

// With --count-url the same server fails check 1, by its count.
func TestCountedDuplicatesFail(t *testing.T) {
	srv, o := firstAnswerServer(t)
	code, out, _ := run(t, "-d", orderBody, "--count-url", srv.URL+"/orders?cart_id=c_42", srv.URL+"/orders")
	l := line(t, out, "1")
	if code != idemcheck.ExitFail || !strings.HasPrefix(l, "FAIL") || !strings.Contains(l, fmt.Sprintf("ran %d times", idemcheck.DefaultConcurrency)) {
		t.Fatalf("exit %d (%d orders), check 1: %s\n%s", code, o.count(), l, out)
	}
}
