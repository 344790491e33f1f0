package idemhttp

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idem-go/idem"
)

// Header names.
const (
	// HeaderKey carries the caller's idempotency key, on requests and
	// echoed on every response to a request that carried one and whose
	// method the middleware covers (Config.Methods).
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is set to "true" on a response replayed from an
	// earlier execution.
	HeaderReplayed = "Idempotent-Replayed"
)

// ParseKey returns the idempotency key of a request header, or "" and a
// nil error when the request carries none.
//
// The field is accepted bare (Idempotency-Key: abc) or as an RFC 8941
// sf-string (Idempotency-Key: "abc"); both name the same key. The request
// must carry exactly one field: two fields, or a bare value holding a
// comma (what a proxy makes of two fields joined into one), are refused
// rather than guessed at. Parameters after an sf-string are refused too:
// no client needs them, and ignoring them would let two different field
// values name one key. The key must then pass idem.ValidateKey.
//
// Every error wraps idem.ErrInvalidKey.
func ParseKey(h http.Header) (string, error) {
	return parseKeyField(h, HeaderKey)
}

// parseKeyField is ParseKey for the field name, in canonical form.
func parseKeyField(h http.Header, name string) (string, error) {
	values, ok := h[name]
	if !ok {
		return "", nil
	}
	if len(values) != 1 {
		return "", fmt.Errorf("%w: %d %s fields, want exactly one", idem.ErrInvalidKey, len(values), name)
	}
	v := strings.Trim(values[0], " \t")
	key := v
	if strings.HasPrefix(v, `"`) {
		var err error
		if key, err = parseString(v); err != nil {
			return "", err
		}
	} else if strings.IndexByte(v, ',') >= 0 {
		return "", fmt.Errorf("%w: a bare key cannot hold a comma (a list of keys?); send it as a quoted string", idem.ErrInvalidKey)
	}
	if err := idem.ValidateKey(key); err != nil {
		return "", err
	}
	return key, nil
}

// parseString parses an RFC 8941 sf-string (section 4.2.5) that must make
// up the whole of v. It allocates only when the string holds escapes.
func parseString(v string) (string, error) {
	// v[0] is the opening quote.
	var b []byte // nil until the first escape
	start := 1
	for i := 1; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\':
			if i+1 >= len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
				return "", fmt.Errorf("%w: bad escape in quoted key", idem.ErrInvalidKey)
			}
			b = append(b, v[start:i]...)
			i++
			b = append(b, v[i])
			start = i + 1
		case c == '"':
			if i != len(v)-1 {
				return "", fmt.Errorf("%w: characters after the quoted key (parameters and lists are not accepted)", idem.ErrInvalidKey)
			}
			if b == nil {
				return v[1:i], nil
			}
			return string(append(b, v[start:i]...)), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("%w: character %d of the quoted key is not printable ASCII", idem.ErrInvalidKey, i)
		}
	}
	return "", fmt.Errorf("%w: unterminated quoted key", idem.ErrInvalidKey)
}
