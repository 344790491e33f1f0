package idemfront

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/idem-go/idem"
)

// ErrInvalidTenant is wrapped by the errors ValidateTenant returns.
var ErrInvalidTenant = errors.New("idem: invalid tenant")

// ValidateTenant reports whether a tenant returned by a front end's tenant
// rule can be used: valid UTF-8 without control characters (C0, DEL and
// C1, U+0080 to U+009F). Anything else is a bug of the server (a tenant
// read from bytes that are no text, or a reserved name), not of the
// caller: refuse the call with a server error that no retry fixes
// (Refuse(InvalidTenant, err)), rather than let a store fail on it (a
// PostgreSQL text column refuses invalid UTF-8, and every such call would
// be answered "store unavailable" and retried for ever) or a log print
// it raw. Control characters also name the key spaces idem keeps for
// itself (the inbox's tenants start with 0x1f): a front end using one
// would share theirs.
//
// The error says where the tenant is wrong, never what it holds: it may
// reach a tracer that exports it.
func ValidateTenant(tenant string) error {
	for i, r := range tenant {
		switch {
		case r == utf8.RuneError && !validAt(tenant, i):
			return fmt.Errorf("%w: byte %d is not valid UTF-8", ErrInvalidTenant, i+1)
		case r < 0x20 || r == 0x7f:
			return fmt.Errorf("%w: byte %d is a control character (%#02x)", ErrInvalidTenant, i+1, r)
		case r >= 0x80 && r <= 0x9f:
			return fmt.Errorf("%w: byte %d starts a C1 control character (U+%04X)", ErrInvalidTenant, i+1, r)
		}
	}
	return nil
}

// validAt reports whether the RuneError at s[i] was written as such
// (U+FFFD, three bytes), not the mark of an invalid byte.
func validAt(s string, i int) bool {
	_, size := utf8.DecodeRuneInString(s[i:])
	return size == 3
}

// OneKey returns the key a call carries in values, the values of its key
// field (a header, a metadata entry): "" when there is none, an error
// wrapping idem.ErrInvalidKey when there are several (a caller who sends
// two keys cannot be told which one counts) or the one fails
// idem.ValidateKey (1 to 255 visible ASCII characters).
func OneKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
	default:
		return "", fmt.Errorf("%w: %d key fields, want exactly one", idem.ErrInvalidKey, len(values))
	}
	if err := idem.ValidateKey(values[0]); err != nil {
		return "", err
	}
	return values[0], nil
}
