package idemfront

import (
	"fmt"
	"net/textproto"
	"strings"
)

// Headers is the rule for what response headers (or metadata) are stored
// with an answer and replayed with it: an allowlist, and the names never
// replayed whatever the allowlist says (a cookie handed to whoever
// retries, a stale date, fields about one connection, the front end's own
// marker). Names compare without regard to case, so that HTTP's
// canonical names and gRPC's lowercase metadata keys follow one rule.
type Headers struct {
	// Each name is filed in lowercase and in its canonical MIME form
	// (Content-Type), so that the names front ends use most are found
	// without lowercasing them first.
	allow map[string]bool
	never map[string]bool
}

// NewHeaders returns the rule storing allow minus never. It refuses a
// name of allow that is in never (a configuration asking for what must
// never be replayed), and a name that is not a token (RFC 9110), which
// no store would keep.
func NewHeaders(allow, never []string) (*Headers, error) {
	h := &Headers{allow: make(map[string]bool, len(allow)), never: make(map[string]bool, len(never))}
	for _, name := range never {
		file(h.never, name)
	}
	for _, name := range allow {
		if !ValidHeaderName(name) {
			return nil, fmt.Errorf("idemfront: %q is not a header name", name)
		}
		if h.never[strings.ToLower(name)] {
			return nil, fmt.Errorf("idemfront: header %s can never be replayed", name)
		}
		file(h.allow, name)
	}
	return h, nil
}

// Stored reports whether a response header named name is stored for
// replays: in the allowlist, and not among the names never replayed.
func (h *Headers) Stored(name string) bool {
	return lookup(h.allow, name)
}

// Replayable reports whether a stored header named name may go out with
// a replay. Checked again on the way out whatever Stored said: the record
// may have been stored under another configuration, or by another
// program.
func (h *Headers) Replayable(name string) bool {
	return !lookup(h.never, name)
}

func file(set map[string]bool, name string) {
	set[strings.ToLower(name)] = true
	set[textproto.CanonicalMIMEHeaderKey(name)] = true
}

// lookup finds name in a set filed by file. A name in canonical form or
// in lowercase that misses is missing in every case (the set holds both
// forms of each of its names), so only a name in another case is
// lowercased, which allocates.
func lookup(set map[string]bool, name string) bool {
	if set[name] {
		return true
	}
	if textproto.CanonicalMIMEHeaderKey(name) == name {
		return false
	}
	return set[lower(name)]
}

// lower returns name in lowercase, allocating only when it holds an
// uppercase letter.
func lower(name string) string {
	for i := 0; i < len(name); i++ {
		if c := name[i]; 'A' <= c && c <= 'Z' {
			return strings.ToLower(name)
		}
	}
	return name
}

// ValidHeaderName reports whether name is a token (RFC 9110): what a
// store accepts as a stored header's name, in any case.
func ValidHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
