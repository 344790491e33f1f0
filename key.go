package idem

import "fmt"

// MaxKeyLength is the longest key accepted, in bytes (Stripe's limit).
const MaxKeyLength = 255

// ValidateKey reports whether key is acceptable: 1 to MaxKeyLength
// characters, each visible ASCII (0x21 to 0x7E). Keys end up in logs and
// database indexes, so nothing else is let through. The error wraps
// ErrInvalidKey and says what is wrong in one line.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: the key is empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("%w: the key is %d characters long, the limit is %d", ErrInvalidKey, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: character %d (%q) is not visible ASCII", ErrInvalidKey, i+1, c)
		}
	}
	return nil
}
