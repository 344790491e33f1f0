package idemproxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// HeaderTenant returns a tenant rule (idemhttp.Config.TenantFunc) that
// reads the tenant from the header name, which the gateway in front of
// the proxy sets from the caller it authenticated, overwriting whatever
// the client sent. A request without it is refused (401).
func HeaderTenant(name string) func(r *http.Request) (string, error) {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		v := r.Header[name]
		if len(v) != 1 || v[0] == "" {
			return "", fmt.Errorf("idemproxy: want exactly one %s header", name)
		}
		return v[0], nil
	}
}

// MinBearerSecret is the shortest secret BearerTenant accepts.
const MinBearerSecret = 16

// BearerTenant returns a tenant rule that derives the tenant from the
// credential of "Authorization: Bearer <credential>": an HMAC-SHA256 of
// it under secret, in hexadecimal, so that neither the store, nor the
// logs, nor a metric ever hold the credential, and whoever reads the
// store cannot test guesses of it without the secret. Every proxy in
// front of one store needs the same secret. A request without a bearer
// credential is refused (401). The proxy does not check the credential:
// a caller who sends a bad one gets a key space of its own, and the
// upstream refuses it as it would without the proxy.
func BearerTenant(secret []byte) (func(r *http.Request) (string, error), error) {
	if len(secret) < MinBearerSecret {
		return nil, fmt.Errorf("idemproxy: the bearer tenant secret must be at least %d bytes, got %d", MinBearerSecret, len(secret))
	}
	secret = append([]byte(nil), secret...)
	return func(r *http.Request) (string, error) {
		v := r.Header["Authorization"]
		if len(v) != 1 {
			return "", errNoBearer
		}
		scheme, cred, ok := strings.Cut(v[0], " ")
		cred = strings.TrimSpace(cred)
		if !ok || !strings.EqualFold(scheme, "Bearer") || cred == "" {
			return "", errNoBearer
		}
		m := hmac.New(sha256.New, secret)
		m.Write([]byte(cred))
		return "bearer:" + hex.EncodeToString(m.Sum(nil)), nil
	}, nil
}

var errNoBearer = errors.New("idemproxy: want one Authorization: Bearer header")
