package demo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"
)

const (
	// maxOrderBody bounds POST /orders: an order is two short fields.
	maxOrderBody = 64 << 10
	// maxCartID bounds cart_id, as the key columns of the table do.
	maxCartID = 255
	// maxTotalCents is the largest integer a JSON number carries exactly in
	// every client (2^53-1, JavaScript's Number.MAX_SAFE_INTEGER).
	maxTotalCents = 1<<53 - 1
)

// orderRequest is the body of POST /orders. Pointers tell a missing field
// from a zero one.
type orderRequest struct {
	CartID     *string `json:"cart_id"`
	TotalCents *int64  `json:"total_cents"`
}

// decodeOrder reads and checks a POST /orders body. Its error is the
// problem's detail, written for the client; it quotes at most a few dozen
// bytes of what the client sent (quote).
//
// What is stored is exactly what the client sent, or nothing:
//   - Text that is not UTF-8, and escapes of half a UTF-16 surrogate pair
//     ("\ud800"), are refused: encoding/json would turn each into U+FFFD and
//     store a cart id the client never sent.
//   - Unknown fields are refused: a misspelt field ("total_cent") would
//     otherwise be dropped silently and the order created without it.
//   - Field names must match exactly, once each: encoding/json would take
//     "CART_ID" for "cart_id", and the last of two "cart_id" fields.
func decodeOrder(r io.Reader) (orderRequest, error) {
	var req orderRequest
	raw, err := io.ReadAll(r)
	if err != nil {
		return req, describeJSONError(err)
	}
	if !utf8.Valid(raw) {
		return req, errors.New("the body is not valid UTF-8; send JSON text in UTF-8")
	}
	if loneSurrogate(raw) {
		return req, errors.New(`the body escapes half of a UTF-16 surrogate pair (a \ud800-\udfff escape alone); send whole characters`)
	}
	if err := checkFieldNames(raw); err != nil {
		return req, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, describeJSONError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return req, errors.New("the body goes on after the JSON object; send exactly one object")
	}
	switch {
	case req.CartID == nil:
		return req, errors.New(`"cart_id" is missing; send a string such as "c_42"`)
	case *req.CartID == "":
		return req, errors.New(`"cart_id" is empty`)
	case len(*req.CartID) > maxCartID:
		return req, fmt.Errorf(`"cart_id" is %d bytes long; the limit is %d`, len(*req.CartID), maxCartID)
	case !plainText(*req.CartID):
		return req, errors.New(`"cart_id" holds a control character`)
	case req.TotalCents == nil:
		return req, errors.New(`"total_cents" is missing; send an integer number of cents such as 1900`)
	case *req.TotalCents < 0:
		return req, errors.New(`"total_cents" is negative`)
	case *req.TotalCents > maxTotalCents:
		return req, fmt.Errorf(`"total_cents" is larger than %d`, int64(maxTotalCents))
	}
	return req, nil
}

// loneSurrogate reports whether a JSON string in raw holds a \u escape of
// a UTF-16 surrogate that is not half of a pair: encoding/json decodes it
// as U+FFFD. Malformed JSON is left to the decoder, which explains it.
func loneSurrogate(raw []byte) bool {
	inString := false
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if !inString {
			inString = c == '"'
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(raw) && raw[i+1] != 'u' {
				i++ // a one-letter escape, \" included
				continue
			}
			r, ok := hex4(raw, i+2)
			if !ok {
				return false
			}
			i += 5 // on the last digit
			switch {
			case 0xdc00 <= r && r <= 0xdfff:
				return true // a low half first
			case 0xd800 <= r && r <= 0xdbff:
				// The low half must follow at once, as another escape.
				low, ok := rune(0), false
				if i+2 < len(raw) && raw[i+1] == '\\' && raw[i+2] == 'u' {
					low, ok = hex4(raw, i+3)
				}
				if !ok || low < 0xdc00 || low > 0xdfff {
					return true
				}
				i += 6
			}
		}
	}
	return false
}

// hex4 reads the four hex digits of a \u escape at raw[at:].
func hex4(raw []byte, at int) (rune, bool) {
	if at+4 > len(raw) {
		return 0, false
	}
	var r rune
	for _, c := range raw[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// checkFieldNames refuses an object whose top-level field names differ
// from the order's in case, or repeat. Anything else (not an object, bad
// JSON) is left to the decoder, which explains it better.
func checkFieldNames(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		name, _ := tok.(string)
		switch {
		case name != "cart_id" && name != "total_cents":
			return fmt.Errorf(`unknown field %s; an order has only "cart_id" and "total_cents", spelt exactly so`, quote(name))
		case seen[name]:
			return fmt.Errorf("%q appears twice; send each field once", name)
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// plainText reports whether s is valid UTF-8 without control characters
// (C0, DEL, C1): what every database of the demo can store and every
// client can print.
func plainText(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, unicode.IsControl) < 0
}

// describeJSONError turns a decoding error into one sentence for the
// client, naming the field when there is one.
func describeJSONError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	var maxErr *http.MaxBytesError
	switch {
	case errors.Is(err, io.EOF):
		return errors.New(`the body is empty; send a JSON object such as {"cart_id":"c_42","total_cents":1900}`)
	case errors.As(err, &maxErr):
		return fmt.Errorf("the body is larger than %d bytes: %w", maxErr.Limit, err)
	case errors.As(err, &typeErr):
		want := map[string]string{"cart_id": "a string", "total_cents": "an integer"}[typeErr.Field]
		if typeErr.Field == "" || want == "" {
			return errors.New("the body must be a JSON object")
		}
		// Value is "number 19.5": the kind, then the client's literal,
		// which is not repeated back.
		kind, _, _ := strings.Cut(typeErr.Value, " ")
		return fmt.Errorf("%q must be %s, not a JSON %s", typeErr.Field, want, kind)
	case errors.As(err, &syntaxErr), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("the body is not valid JSON")
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// checkFieldNames has refused unknown fields already; encoding/json
		// has no type for this error, and its text quotes the name whole.
		return errors.New(`unknown field; an order has only "cart_id" and "total_cents"`)
	}
	return errors.New("the body could not be read")
}
