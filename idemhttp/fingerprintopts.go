package idemhttp

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/http"
)

// fingerprintFuncVersion starts the input hashed over what
// Config.FingerprintFunc returns, so that it never hashes like a default
// fingerprint.
const fingerprintFuncVersion = "idemhttp.fingerprint.func.v1"

// validateFingerprint checks the fingerprint options.
func (c *Config) validateFingerprint() error {
	if c.FingerprintFunc != nil && (c.CanonicalJSON || len(c.IgnoreJSON) > 0 || len(c.FingerprintHeaders) > 0 || c.IgnoreMediaType) {
		return errors.New("idemhttp: Config.FingerprintFunc replaces the whole fingerprint; " +
			"set it without CanonicalJSON, IgnoreJSON, FingerprintHeaders or IgnoreMediaType")
	}
	_, err := ParseJSONPointers(c.IgnoreJSON...)
	return err
}

// fingerprintOf appends the fingerprint of r, whose body is body, to dst
// under the middleware's options. canon is a buffer to reuse for the
// canonical form of a JSON body; the one used is returned.
func (m *Middleware) fingerprintOf(dst []byte, r *http.Request, body, canon []byte) (fp, canonBuf []byte) {
	c := &m.config
	if c.FingerprintFunc != nil {
		v := c.FingerprintFunc(r, body)
		h := sha256.New()
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(fingerprintFuncVersion)))
		h.Write(n[:])
		h.Write([]byte(fingerprintFuncVersion))
		h.Write(v)
		return h.Sum(dst), canon
	}
	if !m.canonicalJSON {
		return fingerprint(dst, r, body, c.FingerprintHeaders, !c.IgnoreMediaType, false), canon
	}
	canon, err := AppendCanonicalJSON(canon[:0], body, m.ignoreJSON)
	if err != nil {
		// Not JSON: its bytes, as without the option.
		return fingerprint(dst, r, body, c.FingerprintHeaders, !c.IgnoreMediaType, false), canon
	}
	return fingerprint(dst, r, canon, c.FingerprintHeaders, !c.IgnoreMediaType, true), canon
}
