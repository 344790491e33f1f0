package idemsql_test

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsql"
	"github.com/idem-go/idem/idemsql/idemmysql"
)

// TestErrorsHoldNoIdentity: the claims a store refuses for their tenant
// (longer than its column, not text PostgreSQL can hold) fail with errors
// that never quote the tenant: a tracer exports error texts (idemotel
// records them even with RecordTenant off), and idemhttp logs them.
func TestErrorsHoldNoIdentity(t *testing.T) {
	forEachDialect(t, func(t *testing.T, env *testDB) {
		engine := newEngine(t, env.store, nil)
		var tenants []string
		switch env.dialect {
		case idemmysql.Dialect:
			tenants = []string{strings.Repeat("acme-SECRET-", 60)} // past VARBINARY(512)
		case idemsql.Postgres:
			tenants = []string{"acme-SECRET-\xff\xfe", "acme-SECRET-\x00x"}
		default:
			t.Skip("SQLite holds any tenant")
		}
		for _, tenant := range tenants {
			_, err := engine.Do(context.Background(), idem.Operation{Tenant: tenant, Key: "k1"}, func(ctx context.Context) (idem.Result, error) {
				return idem.Result{Status: 201}, nil
			})
			if err == nil {
				t.Fatalf("tenant of %d bytes: Do succeeded", len(tenant))
			}
			if msg := err.Error(); strings.Contains(msg, "SECRET") || strings.Contains(msg, "\xff") || strings.Contains(msg, "0xff") {
				t.Errorf("tenant of %d bytes: the error quotes it: %s", len(tenant), msg)
			}
		}
	})
}
