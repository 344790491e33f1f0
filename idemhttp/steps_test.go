package idemhttp_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// stepsRefused is a memory store whose SaveStep fails, as a full store's
// would.
type stepsRefused struct{ *idemmem.Store }

func (stepsRefused) SaveStep(context.Context, idem.SaveStepParams) error {
	return errors.New("OOM command not allowed when used memory > 'maxmemory'")
}

// TestStepNotSavedHoldsKey: a handler cannot return an error through
// net/http, so whatever it answers after a step that ran but was not
// recorded, the answer is discarded for a 503, nothing is stored, and the
// key stays held: the retry gets 409, not a second charge.
func TestStepNotSavedHoldsKey(t *testing.T) {
	engine, err := idem.NewEngine(stepsRefused{idemmem.NewStore(nil)}, &idem.Config{Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.NewMiddleware(engine, &idemhttp.Config{TenantFunc: tenantOf, Logger: quietLogger})
	if err != nil {
		t.Fatal(err)
	}
	charges := 0
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := idem.Step(r.Context(), "charge", func(context.Context) (string, error) {
			charges++
			return "ch_1", nil
		})
		if err != nil {
			// What a handler may well do: say "try again", not stored.
			idem.NotExecuted(r.Context())
			http.Error(w, "card outcome unknown", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	send := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Authorization", "Bearer acme")
		req.Header.Set(idemhttp.HeaderKey, "pay-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := send(); rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Header().Get("Content-Type"), "problem+json") || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("first: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	if rec := send(); rec.Code != http.StatusConflict {
		t.Fatalf("retry: %d %s; want 409 (the key held until its lease ends)", rec.Code, rec.Body)
	}
	if charges != 1 {
		t.Fatalf("%d charges, want 1", charges)
	}
}
