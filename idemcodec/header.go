// Package idemcodec holds the encodings a store keeps a record's parts
// in, shared by every store of this repository so that what one wrote
// reads the same everywhere, and so that a store's author writes none:
//
//	header, err := idemcodec.MarshalHeader(p.Result.Header) // a canonical JSON object
//	step := idemcodec.AppendStep(nil, p.Name, p.Value)      // append it with SQL ||, Redis APPEND
//	steps, err := idemcodec.UnmarshalSteps(stored)          // the record's idem.RecordedStep list
//
// The decoders refuse what the encoders could not have written, so a
// damaged or tampered row cannot inject a header into a replay or crash a
// read.
package idemcodec

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/idem-go/idem/internal/fieldtext"
)

// MarshalHeader encodes stored metadata canonically (a JSON object of
// string arrays, keys sorted) so SQL stores keep it readable to operators.
// A nil or empty header encodes to nil. It refuses what UnmarshalHeader
// refuses (see there), so that a store never writes a record it cannot
// read back: such a record would answer every retry with a store error.
func MarshalHeader(h map[string][]string) ([]byte, error) {
	if len(h) == 0 {
		return nil, nil
	}
	if err := checkHeader(h); err != nil {
		return nil, err
	}
	return json.Marshal(h)
}

// UnmarshalHeader decodes what MarshalHeader produced, and refuses what it
// could not have: a name that is not an HTTP token, or a value holding a
// control character. A damaged or tampered row therefore cannot inject a
// header into a replay.
func UnmarshalHeader(b []byte) (map[string][]string, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var h map[string][]string
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("idem: stored header: %w", err)
	}
	if err := checkHeader(h); err != nil {
		return nil, err
	}
	return h, nil
}

// checkHeader refuses a name that is not a token (RFC 9110), two names
// that differ only in case, and a value holding a control character other
// than tab. Names are accepted in any case: HTTP front ends store the
// canonical form (Content-Type), gRPC's metadata keys are lowercase
// (content-type), and each front end writes a replayed name in its own
// protocol's form; two spellings of one name would replay one header
// twice.
func checkHeader(h map[string][]string) error {
	var seen map[string]bool // lowercase names, when there are several
	if len(h) > 1 {
		seen = make(map[string]bool, len(h))
	}
	for name, values := range h {
		if !validHeaderName(name) {
			return fmt.Errorf("idem: stored header: invalid name %q", name)
		}
		if seen != nil {
			lower := strings.ToLower(name)
			if seen[lower] {
				return fmt.Errorf("idem: stored header: name %q given twice, in two cases", name)
			}
			seen[lower] = true
		}
		for _, v := range values {
			if !fieldtext.Clean(v) {
				return fmt.Errorf("idem: stored header %s: control character in value", name)
			}
		}
	}
	return nil
}

func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
