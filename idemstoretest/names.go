package idemstoretest

import (
	"crypto/sha256"
	"encoding/hex"
	"math/rand/v2"
)

// newToken returns a fresh non-zero lease token, as the engine draws them.
func newToken() int64 {
	for {
		if t := rand.Int64(); t != 0 {
			return t
		}
	}
}

// newName returns prefix and 12 random hex digits: tenants, keys and
// business ids no other case or run uses.
func newName(prefix string) string {
	var b [6]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return prefix + "-" + hex.EncodeToString(b[:])
}

// fingerprint returns the fingerprint of a request described by s.
func fingerprint(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}
