package demo

import (
	"context"
	"net/http"
	"strings"
)

// DefaultTenant is the tenant of a request without an Authorization header.
const DefaultTenant = "default"

// maxTenant bounds a tenant name, which becomes part of a primary key.
const maxTenant = 128

type tenantKey struct{}

// TenantFrom returns the tenant of the request whose context is ctx:
// the Bearer name, or DefaultTenant.
func TenantFrom(ctx context.Context) string {
	if t, ok := ctx.Value(tenantKey{}).(string); ok {
		return t
	}
	return DefaultTenant
}

// withTenant is the demo's authentication: "Authorization: Bearer <name>"
// makes the caller tenant <name>; no header makes it DefaultTenant. It is a
// stand-in for real authentication, and sits where real authentication
// must: in front of the idempotency layer, so that a 401 is never stored
// under a key and the caller may retry once authenticated.
func withTenant(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tenant, ok := parseBearer(r.Header.Values("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem demo"`)
			writeProblem(w, http.StatusUnauthorized, "unauthenticated", "Malformed Authorization",
				`Send "Authorization: Bearer <tenant>" with a tenant name of 1 to 128 letters, digits or -._~+/, or no Authorization header for the "default" tenant.`)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), tenantKey{}, tenant)))
	})
}

// parseBearer reads the Authorization fields of a request. The token
// follows RFC 6750's b64token syntax, so that it is safe in logs and keys.
func parseBearer(values []string) (string, bool) {
	switch len(values) {
	case 0:
		return DefaultTenant, true
	case 1:
	default:
		return "", false // two credentials: which one is the caller?
	}
	scheme, token, ok := strings.Cut(values[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" || len(token) > maxTenant {
		return "", false
	}
	body := strings.TrimRight(token, "=")
	if body == "" {
		return "", false
	}
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("-._~+/", c) >= 0:
		default:
			return "", false
		}
	}
	return token, true
}
