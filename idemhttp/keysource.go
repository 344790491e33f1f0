package idemhttp

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemfront"
)

// ParseKeyHeader is ParseKey for a key carried in the header field name
// (an API that calls it X-Idempotency-Key), under the same rules.
func ParseKeyHeader(h http.Header, name string) (string, error) {
	return parseKeyField(h, http.CanonicalHeaderKey(name))
}

// keyOf returns the request's key under the middleware's key source:
// Config.KeyFunc, else the Config.KeyHeader field (Idempotency-Key by
// default). "" and a nil error: the request carries none.
func (m *Middleware) keyOf(r *http.Request) (string, error) {
	if m.config.KeyFunc == nil {
		return parseKeyField(r.Header, m.keyHeader)
	}
	key, err := m.config.KeyFunc(r)
	if err != nil {
		return "", fmt.Errorf("%w: %w", idem.ErrInvalidKey, err)
	}
	if key == "" {
		return "", nil
	}
	if err := idem.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// echoKey echoes the key field on the answer, as the client sent it.
// A key read by Config.KeyFunc is not echoed: it came from wherever the
// function found it, which the answer has no field for.
func (m *Middleware) echoKey(w http.ResponseWriter, r *http.Request) {
	if m.config.KeyFunc != nil {
		return
	}
	if v, ok := r.Header[m.keyHeader]; ok {
		w.Header()[m.keyHeader] = v
	}
}

// validateKeySource checks Config.KeyHeader and Config.KeyFunc and
// returns the canonical name of the key field.
func (c *Config) validateKeySource() (string, error) {
	if c.KeyHeader != "" && c.KeyFunc != nil {
		return "", fmt.Errorf("idemhttp: Config.KeyHeader and Config.KeyFunc are both set; keep one")
	}
	if c.KeyHeader == "" {
		return HeaderKey, nil
	}
	if !idemfront.ValidHeaderName(c.KeyHeader) {
		return "", fmt.Errorf("idemhttp: Config.KeyHeader %q is not a header name", c.KeyHeader)
	}
	name := http.CanonicalHeaderKey(c.KeyHeader)
	if name != HeaderKey && slices.ContainsFunc(neverReplayed, func(n string) bool { return strings.EqualFold(n, name) }) {
		return "", fmt.Errorf("idemhttp: Config.KeyHeader %s is a header the middleware keeps for itself or the connection", name)
	}
	for _, h := range c.ReplayHeaders {
		if strings.EqualFold(h, name) {
			return "", fmt.Errorf("idemhttp: ReplayHeaders: %s is the key header, which every answer echoes and no replay stores", name)
		}
	}
	return name, nil
}

// keyProblems returns the problems of a missing and of an invalid key,
// worded for the middleware's key source: the field's own name, or "an
// idempotency key" when Config.KeyFunc finds it.
func keyProblems(keyHeader string, keyFunc bool) (required, invalid *problem) {
	if keyHeader == HeaderKey && !keyFunc {
		return problemKeyRequired, problemInvalidKey
	}
	name := keyHeader + " header"
	rules := "Send exactly one " + keyHeader + " field holding 1 to 255 visible ASCII characters, bare or as a quoted string, without commas when bare."
	if keyFunc {
		name = "idempotency key"
		rules = "Send one idempotency key of 1 to 255 visible ASCII characters."
	}
	required = newProblem(problemKeyRequired.slug, problemKeyRequired.status,
		"Idempotency key required",
		"This endpoint requires an "+name+". Generate a unique key (a UUIDv4) per operation and send the same key on every retry of it.")
	invalid = newProblem(problemInvalidKey.slug, problemInvalidKey.status,
		"Invalid idempotency key",
		rules)
	return required, invalid
}
