package idempg_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// TestErrorsHoldNoIdentity: a tenant PostgreSQL's text cannot hold (not
// UTF-8, a NUL byte) is refused without its value in the error, which a
// tracer exports (idemotel records error texts even with RecordTenant
// off) and idemhttp logs.
func TestErrorsHoldNoIdentity(t *testing.T) {
	e := newEnv(t, 4)
	eng := mustEngine(t, e.store)
	for _, tenant := range []string{"acme-SECRET-\xff\xfe", "acme-SECRET-\x00x"} {
		_, err := eng.Do(context.Background(), idem.Operation{Tenant: tenant, Key: "k1"}, func(ctx context.Context) (idem.Result, error) {
			t.Error("the handler ran for a tenant PostgreSQL cannot hold")
			return idem.Result{Status: 201}, nil
		})
		if err == nil {
			t.Fatalf("tenant %q: Do succeeded", tenant)
		}
		if msg := err.Error(); strings.Contains(msg, "SECRET") || strings.Contains(msg, "\\xff") || strings.Contains(msg, "\xff") {
			t.Errorf("tenant %q: the error quotes it: %s", tenant, msg)
		}
	}
}
