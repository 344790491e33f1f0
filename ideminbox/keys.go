package ideminbox

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/idem-go/idem"
)

// Key returns the dedup key of a message id: the id itself when it is a
// valid idem key, otherwise "sha256:" and the hex SHA-256 of the id. Ids
// that themselves start with "sha256:" are hashed too, so a hashed key
// never collides with a plain one.
func Key(id string) string {
	if idem.ValidateKey(id) == nil && !strings.HasPrefix(id, hashedPrefix) {
		return id
	}
	sum := sha256.Sum256([]byte(id))
	return hashedPrefix + hex.EncodeToString(sum[:])
}

const hashedPrefix = "sha256:"

// lastRunKey returns the key of the record of a message's last run:
// "sha256:last-run:" and the hex SHA-256 of the message's key. Key never
// returns it (it hashes every id that starts with "sha256:" into 64 hex
// digits right after the prefix), so no message id can claim it.
func lastRunKey(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hashedPrefix + "last-run:" + hex.EncodeToString(sum[:])
}

// probeKey is the key the store checks claim and release. Key never
// returns it: it hashes every id that starts with "sha256:", into 64 hex
// digits.
const probeKey = hashedPrefix + "store-check"
