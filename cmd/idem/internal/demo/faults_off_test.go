//go:build !idemfaults

package demo

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A release build has no crash injection: with IDEM_FAULT set, Faults
// returns the handler untouched and says why, and the request carrying
// the key runs to its answer.
func TestNoFaultsInReleaseBuilds(t *testing.T) {
	t.Setenv(envFault, string(faultAfterClaim))
	t.Setenv(envFaultKey, "k")
	logs := &syncBuffer{}
	reached := false
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		injectFault(r.Context(), faultAfterClaim)
		injectFault(r.Context(), faultAfterWrite)
		reached = true
	})
	h := Faults(next, slog.New(slog.NewTextHandler(logs, nil)))
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/orders", nil)
	r.Header.Set("Idempotency-Key", "k")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if !reached {
		t.Fatal("the request never reached the handler")
	}
	if !strings.Contains(logs.String(), "no crash injection") {
		t.Fatalf("no warning about IDEM_FAULT: %q", logs)
	}
}
